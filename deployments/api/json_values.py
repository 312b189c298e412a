"""JSON values as llama-server reads them: nlohmann::json's ``get<T>`` conversions (an int field
truncates a float, accepts a boolean, wraps an overflowing integer; a wrong type is a
``type_error.302``), float32 rounding, and the numbers' limits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
FLT_MAX = float(np.finfo(np.float32).max)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def type_error(expected: str, value: Any) -> ValueError:
    return ValueError(
        f"[json.exception.type_error.302] type must be {expected}, but is {json_type(value)}"
    )


def f32(value: float) -> float:
    """A float32 widened to double, as the reference echoes floats (0.8 -> 0.800000011920929)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _wrap(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def json_number(value: int | float) -> int | float:
    """The number as nlohmann::json holds it: an integer that fits neither int64 nor uint64 is
    a double (infinite past a double's range)."""
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def to_int(value: Any, bits: int = 32, unsigned: bool = False) -> int:
    """An integer converts modulo the target's width; a double truncates, and one that does not
    fit the target (1e39 in an int32, -1.0 in the uint32 seed) is refused: the reference's C++
    conversion of it is undefined behaviour."""
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise type_error("number", value)
    value = json_number(value)
    if isinstance(value, float):
        lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if not (math.isfinite(value) and lo <= math.trunc(value) <= hi):
            raise ValueError(f"{value!r} is out of the {'u' if unsigned else ''}int{bits} range")
        value = math.trunc(value)
    if unsigned:
        return value & ((1 << bits) - 1)
    return _wrap(value, bits)


def to_float(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise type_error("number", value)
    return f32(float(json_number(value)))


def to_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise type_error("boolean", value)
    return value


def to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise type_error("string", value)
    return value


def _fmt(value: float | int, is_float: bool) -> str:
    return f"{value:.6f}" if is_float else str(value)
