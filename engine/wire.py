"""Plain data on a socket: msgpack with a fixed set of dataclasses, never pickle (#28).

The stream channel between replica processes (deployments/serve/channel.py) and the sharded
ranks' broadcast (engine/lockstep.py) carry engine events, requests and SSE bytes. Decoding them
must not be able to run code, whoever wrote the bytes: a ``Codec`` packs None, bools, numbers,
str, bytes, lists, tuples, dicts and instances of the dataclasses it is given, and unpacks only
those. A dataclass travels as an array whose first element is an extension value naming its
class, then its fields' values; a tuple as an array led by the tuple mark. An unknown class, a
field count that does not fit, or anything but msgpack is refused with ``WireError``.
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Any

import msgpack

DATACLASS, TUPLE = 1, 2  # msgpack extension type codes
TUPLE_MARK = msgpack.ExtType(TUPLE, b"")


class WireError(ValueError):
    """Bytes that are not a frame of this codec, or an object it cannot pack."""


class _Lead:
    """What a decoded array's leading extension value stands for: a class, or a tuple."""

    __slots__ = ("cls", "n_fields")

    def __init__(self, cls: type | None, n_fields: int = 0):
        self.cls, self.n_fields = cls, n_fields


_TUPLE_LEAD = _Lead(None)


class Codec:
    """Packs and unpacks plain data and instances of ``types`` (dataclasses, by class name)."""

    def __init__(self, types: tuple[type, ...]):
        self._pack: dict[type, tuple[msgpack.ExtType, Any, int]] = {}
        self._leads: dict[bytes, _Lead] = {}
        for cls in types:
            fields = [f for f in dataclasses.fields(cls) if f.init]
            if any(f.kw_only for f in fields):
                raise TypeError(f"{cls.__name__}: keyword-only fields are not supported")
            names = [f.name for f in fields]
            tag = cls.__name__.encode()
            self._pack[cls] = (msgpack.ExtType(DATACLASS, tag), operator.attrgetter(*names),
                               len(names))
            self._leads[tag] = _Lead(cls, len(names))

    def dumps(self, value: Any) -> bytes:
        try:
            return msgpack.packb(value, default=self._default, strict_types=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise WireError(f"cannot pack {type(value).__name__}: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            value = msgpack.unpackb(data, ext_hook=self._ext, list_hook=self._list,
                                    object_hook=_no_lead_in, strict_map_key=False)
        except WireError:
            raise
        except Exception as exc:  # msgpack's own errors (ExtraData, FormatError, ...)
            raise WireError(f"not a frame: {type(exc).__name__}: {exc}") from exc
        if isinstance(value, _Lead):
            raise WireError("a class mark outside its array")
        return value

    def _default(self, obj: Any) -> Any:
        packing = self._pack.get(type(obj))
        if packing is not None:
            mark, get, n = packing
            return [mark, get(obj)] if n == 1 else [mark, *get(obj)]
        if isinstance(obj, tuple):
            return [TUPLE_MARK, *obj]
        # with strict_types, subclasses land here (bool is packed before them): an IntEnum or
        # NumPy's numbers go as the plain number, a str enum as its str
        if isinstance(obj, numbers.Integral):
            return int(obj)
        if isinstance(obj, numbers.Real):
            return float(obj)
        if isinstance(obj, str):
            return str.__str__(obj)
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        if isinstance(obj, list):
            return list(obj)
        if isinstance(obj, dict):
            return dict(obj)
        raise TypeError(f"{type(obj).__name__} is not plain data of this codec")

    def _ext(self, code: int, data: bytes) -> _Lead:
        if code == TUPLE and not data:
            return _TUPLE_LEAD
        lead = self._leads.get(data) if code == DATACLASS else None
        if lead is None:
            raise WireError(f"unknown extension value {code}:{data[:40]!r}")
        return lead

    def _list(self, items: list) -> Any:
        lead = items[0] if items else None
        if type(lead) is not _Lead:
            if _Lead in map(type, items):
                raise WireError("a class mark inside an array it does not lead")
            return items
        if lead is _TUPLE_LEAD:
            return tuple(items[1:])
        if len(items) - 1 != lead.n_fields:
            raise WireError(f"{lead.cls.__name__} takes {lead.n_fields} fields, "
                            f"not {len(items) - 1}")
        return lead.cls(*items[1:])


def _no_lead_in(mapping: dict) -> dict:
    if _Lead in map(type, mapping) or _Lead in map(type, mapping.values()):
        raise WireError("a class mark inside a map")
    return mapping
