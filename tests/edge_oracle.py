"""The reference's answer to a request with numbers at their edges, and how an answer differs
from it (tests/edges.py's scan and tests/serve/test_edges.py use it).

Written from ../shared/spec/llama-server-native-api.md (§2.2 parsing, §2.3 field table) and
common/sampling.cpp's common_sampler_init, not from deployments/api/schema.py: the schema's table is
only checked to list the same numeric fields in the same order (tests/serve/test_edges.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


# ---- the reference's answer ----------------------------------------------------------------
FLT_MAX = 3.4028234663852886e38
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class Spec:
    """One numeric row of the spec's field table: C type, hard limits (400) or soft ones
    (clamped), aliases; ``hard`` of ``(1, None)`` is n_cmpl's [1, n_parallel]."""

    ctype: str  # int32, int64, uint32, float
    hard: tuple | None = None
    soft: tuple | None = None
    aliases: tuple[str, ...] = ()


HARD_I32 = (0, INT32_MAX)
SPEC: dict[str, Spec] = {  # declaration order: the first error wins
    "sse_ping_interval": Spec("int32", hard=(-1, INT32_MAX)),
    "n_predict": Spec("int32", hard=(-1, INT32_MAX),
                      aliases=("max_completion_tokens", "max_tokens")),
    "n_indent": Spec("int32", hard=HARD_I32),
    "n_keep": Spec("int32", hard=(-1, INT32_MAX)),
    "n_discard": Spec("int32", hard=HARD_I32),
    "n_cmpl": Spec("int32", hard=(1, None), aliases=("n",)),
    "n_cache_reuse": Spec("int32", hard=HARD_I32),
    "t_max_predict_ms": Spec("int64", hard=(-1, INT64_MAX)),
    "top_k": Spec("int32", soft=(0, INT32_MAX)),
    "top_p": Spec("float", soft=(0.0, 1.0)),
    "min_p": Spec("float", soft=(0.0, 1.0)),
    "top_n_sigma": Spec("float"),
    "xtc_probability": Spec("float", soft=(0.0, 1.0)),
    "xtc_threshold": Spec("float", soft=(0.0, 1.0)),
    "typical_p": Spec("float"),
    "temperature": Spec("float", soft=(0.0, math.inf)),
    "dynatemp_range": Spec("float"),
    "dynatemp_exponent": Spec("float"),
    "repeat_last_n": Spec("int32", hard=HARD_I32),
    "repeat_penalty": Spec("float"),
    "frequency_penalty": Spec("float"),
    "presence_penalty": Spec("float"),
    "dry_multiplier": Spec("float"),
    "dry_base": Spec("float"),  # below 1: the server default
    "dry_allowed_length": Spec("int32", hard=HARD_I32),
    "dry_penalty_last_n": Spec("int32", hard=HARD_I32),
    "mirostat": Spec("int32", soft=(0, 2)),
    "mirostat_tau": Spec("float"),
    "mirostat_eta": Spec("float"),
    "adaptive_target": Spec("float", soft=(-FLT_MAX, 1.0)),
    "adaptive_decay": Spec("float", hard=(0.0, 0.99)),
    "seed": Spec("uint32", soft=(0, UINT32_MAX)),
    "n_probs": Spec("int32", aliases=("logprobs",)),
    "min_keep": Spec("int32", hard=HARD_I32),
    "chat_format": Spec("int32"),
    "reasoning_budget_tokens": Spec("int32", hard=(-1, INT32_MAX)),
}
DRY_BASE_DEFAULT = 1.75


class Undefined(Exception):
    """The reference's C++ conversion of this value is undefined behaviour."""


def f32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def c_value(value: object, ctype: str) -> int | float:
    """What nlohmann's get<T>() makes of a JSON number: an integer beyond int64 and uint64 is
    read as a double; integers wrap into T; a double truncates, undefined outside T."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int) and not INT64_MIN <= value <= UINT64_MAX:
        value = float(value) if abs(value) < 2**1024 else math.copysign(math.inf, value)
    if ctype == "float":
        return f32(value)
    bits, signed = {"int32": (32, True), "int64": (64, True), "uint32": (32, False)}[ctype]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if isinstance(value, float):
        if not math.isfinite(value) or not lo <= math.trunc(value) <= hi:
            raise Undefined
        return math.trunc(value)
    value %= 2**bits
    return value - 2**bits if signed and value > hi else value


def std_to_string(value: int | float, ctype: str) -> str:
    return f"{value:.6f}" if ctype == "float" else str(value)


@dataclass
class Expected:
    """A 200 with these effective values (as generation_settings echoes them), or a 400 with
    this exact message, or (``named``) a 400 whose message names this field."""

    message: str | None = None
    named: str | None = None
    effective: dict = field(default_factory=dict)


def reference_answer(body: dict, n_parallel: int) -> Expected:
    """The native schema, then common_sampler_init's checks, on ``body``."""
    out = Expected()
    for name, spec in SPEC.items():
        key = next((k for k in (name, *spec.aliases) if body.get(k) is not None), None)
        if key is None:
            continue
        try:
            value = c_value(body[key], spec.ctype)
        except Undefined:
            return Expected(named=key)
        if spec.hard is not None:
            lo, hi = spec.hard[0], n_parallel if spec.hard[1] is None else spec.hard[1]
            if not lo <= value <= hi:
                return Expected(f"Field '{key}': Value must be between "
                                f"{std_to_string(lo, spec.ctype)} <= value <= "
                                f"{std_to_string(hi, spec.ctype)}, but got "
                                f"{std_to_string(value, spec.ctype)}")
        if spec.soft is not None:
            value = min(max(value, spec.soft[0]), spec.soft[1])
        out.effective[name] = value
    if out.effective.get("dry_base", DRY_BASE_DEFAULT) < 1.0:
        out.effective["dry_base"] = f32(DRY_BASE_DEFAULT)
    if out.effective.get("n_cache_reuse", 0) != 0:  # mlxray's by-design refusal (the manifest)
        return Expected(named="n_cache_reuse")
    error = sampler_init_error(out.effective)
    return Expected(f"Failed to initialize samplers: {error}") if error else out


def sampler_init_error(effective: dict) -> str | None:
    repeat = np.float32(effective.get("repeat_penalty", 1.0))
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.float32(1.0) / repeat
    if not (np.isfinite(repeat) and repeat > 0 and np.isfinite(reciprocal)):
        return "penalty_repeat must be finite and greater than 0"
    if not np.isfinite(np.float32(effective.get("frequency_penalty", 0.0))):
        return "penalty_freq must be finite"
    if not np.isfinite(np.float32(effective.get("presence_penalty", 0.0))):
        return "penalty_present must be finite"
    return None


def chat_reference_answer(body: dict, n_parallel: int) -> Expected:
    """/v1/chat/completions: logprobs true takes n_probs from top_logprobs (json_value: a number
    converts to int, anything else is 20); a non-boolean logprobs is read as false and copied on
    as the native alias of n_probs."""
    native = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    if body.get("logprobs") is True:
        top = body.get("top_logprobs")
        if isinstance(top, (int, float)):
            try:
                native["n_probs"] = c_value(top, "int32")
            except Undefined:
                return Expected(named="top_logprobs")
    elif body.get("top_logprobs") is not None:
        return Expected("top_logprobs requires logprobs to be set to true")
    elif not isinstance(body.get("logprobs"), (bool, type(None))):
        native["logprobs"] = body["logprobs"]
    return reference_answer(native, n_parallel)


def expected_for(route: str, body: dict, n_parallel: int) -> Expected:
    if route == "/v1/chat/completions":
        return chat_reference_answer(body, n_parallel)
    return reference_answer(body, n_parallel)


# ---- checking an answer ----------------------------------------------------------------------
PROB_KEYS = ("logprob", "prob")
ECHOED = ("seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
          "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
          "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier",
          "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau",
          "mirostat_eta", "adaptive_target", "adaptive_decay", "n_predict", "n_keep",
          "n_discard", "n_probs", "min_keep")


def read(response: httpx.Response, stream: bool) -> tuple[int, str, list]:
    """Status, error message and the JSON documents of an answer (a stream's frames; an error
    frame counts as its status)."""
    if response.status_code != 200:
        try:
            return response.status_code, response.json()["error"]["message"], []
        except (ValueError, KeyError, TypeError):
            return response.status_code, response.text[:200], []
    if not stream:
        return 200, "", [response.json()]
    docs = [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]
    for doc in docs:
        if isinstance(doc, dict) and "error" in doc:
            return doc["error"]["code"], doc["error"]["message"], docs
    return 200, "", docs


def _numbers(doc: object, path: str = "") -> Iterator[str]:
    """Every non-finite number, and every probability that is not a number, by path."""
    if isinstance(doc, float) and not math.isfinite(doc):
        yield path
    elif isinstance(doc, dict):
        for key, value in doc.items():
            if key in PROB_KEYS and not isinstance(value, (int, float)):
                yield f"{path}.{key}"
            elif key != "generation_settings":
                yield from _numbers(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _numbers(value, f"{path}[{i}]")


def _settings_differ(doc: object, effective: dict) -> Iterator[str]:
    results = doc if isinstance(doc, list) else [doc]
    for result in results:
        settings = result.get("generation_settings") if isinstance(result, dict) else None
        if not isinstance(settings, dict):
            continue
        for name, value in effective.items():
            if name in ECHOED:
                want = value if math.isfinite(value) else None
                if settings.get(name) != want:
                    yield f"generation_settings.{name} {settings.get(name)!r} != {want!r}"


def problems(route: str, body: dict, response: httpx.Response, n_parallel: int) -> list[str]:
    """How the answer differs from the reference's (empty: it does not)."""
    expected = expected_for(route, body, n_parallel)
    status, message, docs = read(response, bool(body.get("stream")))
    if expected.message is not None or expected.named is not None:
        if status != 400:
            return [f"{status} {message!r}, expected 400 {expected.message or expected.named!r}"]
        if expected.message is not None and message != expected.message:
            return [f"400 {message!r}, expected {expected.message!r}"]
        if expected.named is not None and not message.startswith(f"Field '{expected.named}': "):
            return [f"400 {message!r} does not name {expected.named!r}"]
        return []
    if status != 200:
        return [f"{status} {message!r}, expected 200"]
    out = [f"non-finite number at {path}" for doc in docs for path in _numbers(doc)]
    return out + [d for doc in docs for d in _settings_differ(doc, expected.effective)]
