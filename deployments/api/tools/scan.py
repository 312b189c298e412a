"""A cursor over generated text that may still be growing: each step either matches, reports
that the text ended too early (``Incomplete``: wait for more tokens), or fails (``Mismatch``).

The parsers read the whole text again after every token, as llama-server does; these steps
are what make a half-written marker, string or JSON value wait instead of fail.
"""

from __future__ import annotations

import json
import re

_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_WS = " \t\n\r"


class Incomplete(Exception):
    """The text ends inside what is being read."""


class Mismatch(Exception):
    """The text cannot be what is being read."""


def held_back(text: str, *markers: str) -> str:
    """``text`` less a tail that could be the start of one of ``markers`` (``OK <`` is ``OK ``
    while ``<tool_call>`` may still come)."""
    cut = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                cut = max(cut, size)
                break
    return text[: len(text) - cut] if cut else text


class Cursor:
    __slots__ = ("text", "pos")

    def __init__(self, text: str, pos: int = 0):
        self.text = text
        self.pos = pos

    @property
    def rest(self) -> str:
        return self.text[self.pos:]

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WS:
            self.pos += 1

    def expect(self, literal: str) -> None:
        rest = self.text[self.pos:self.pos + len(literal)]
        if rest == literal:
            self.pos += len(literal)
        elif literal.startswith(rest):
            raise Incomplete
        else:
            raise Mismatch

    def peek(self, literal: str) -> bool:
        """Whether ``literal`` comes next (Incomplete while the text could still become it)."""
        rest = self.text[self.pos:self.pos + len(literal)]
        if rest == literal:
            return True
        if literal.startswith(rest):
            raise Incomplete
        return False

    def until(self, marker: str) -> str:
        """The text up to ``marker``, which is consumed too."""
        found = self.text.find(marker, self.pos)
        if found < 0:
            raise Incomplete
        out = self.text[self.pos:found]
        self.pos = found + len(marker)
        return out

    def string(self) -> str:
        """A JSON string, decoded."""
        start = self.pos
        self.expect('"')
        end = _string_end(self.text, self.pos)
        self.pos = end
        try:
            return json.loads(self.text[start:end])
        except ValueError:
            raise Mismatch from None

    def value(self) -> str:
        """A JSON value's text, its extent found by brackets and strings (validated by the
        caller when it needs to be JSON)."""
        start = self.pos
        if self.at_end():
            raise Incomplete
        if self.text[start] in "{[":
            self.pos = _container_end(self.text, start)
        elif self.text[start] == '"':
            self.pos = _string_end(self.text, start + 1)
        else:
            match = _SCALAR.match(self.text, start)
            if match is None:
                if any(w.startswith(self.text[start:]) for w in ("true", "false", "null")):
                    raise Incomplete
                raise Mismatch
            if match.end() == len(self.text):
                raise Incomplete  # a number may go on
            self.pos = match.end()
        return self.text[start:self.pos]


def _string_end(text: str, pos: int) -> int:
    """The index after the closing quote of a string whose opening quote is before ``pos``."""
    while pos < len(text):
        char = text[pos]
        if char == "\\":
            pos += 2
            continue
        if char == '"':
            return pos + 1
        pos += 1
    raise Incomplete


def _container_end(text: str, pos: int) -> int:
    depth = 0
    while pos < len(text):
        char = text[pos]
        if char == '"':
            pos = _string_end(text, pos + 1)
            continue
        if char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return pos + 1
        pos += 1
    raise Incomplete


def json_object(text: str) -> dict:
    """``text`` as a JSON object, else Mismatch."""
    try:
        value = json.loads(text)
    except ValueError:
        raise Mismatch from None
    if not isinstance(value, dict):
        raise Mismatch
    return value
