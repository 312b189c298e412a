"""Lazy grammars: llama.cpp's wait for a trigger before a grammar constrains anything.

While a lazy grammar waits, sampling is free and every generated token's piece (special tokens
rendered as text) is appended to a byte buffer. A trigger token fires at once; otherwise each
word and pattern, in the order the request gave them, is looked for in the buffer, and the first
that is found fires. The grammar then starts where the match starts (for a pattern with capture
groups, at the first non-empty group) and is fed the generated text from there: the tail of the
token the match starts inside, then the whole tokens after it. From the next step on it masks
as a plain grammar does.

Patterns are compiled as bytes regexes over the UTF-8 buffer, as llama.cpp runs ``std::regex``
over its byte string. A pattern that starts with ``^`` and ends with ``$`` is matched against the
whole buffer first, then searched, as in llama.cpp; a final ``$`` matches only at the very end
(ECMAScript), not before a final newline as Python's would. An ECMAScript ``\\uXXXX`` escape
(which Python's bytes regexes refuse) is translated: an ASCII one to its byte, anywhere; another
one, outside a character class, to its UTF-8 bytes as one group; inside a class it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from .types import (
    TRIGGER_PATTERN,
    TRIGGER_PATTERN_FULL,
    TRIGGER_TOKEN,
    TRIGGER_WORD,
    EngineError,
    GrammarTrigger,
)

Search = Callable[[bytearray, int], "int | None"]  # (buffer, length before the new piece)


@dataclass(frozen=True, slots=True)
class Fired:
    """What the grammar is fed when a trigger fires: the bytes of the token the match starts
    inside, from the match on (empty when it starts on a token boundary), then whole tokens."""

    head: bytes
    tokens: list[int]


def anchored(pattern: str) -> str:
    """A TRIGGER_PATTERN_FULL pattern as llama.cpp anchors it."""
    if not pattern:
        return "^$"
    return ("" if pattern.startswith("^") else "^") + pattern + (
        "" if pattern.endswith("$") else "$")


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> re.Pattern[bytes]:
    """The pattern as a bytes regex; raises ``re.error`` when it does not compile."""
    return re.compile(_unicode_escapes(_ecmascript_end(pattern)).encode("utf-8"))


def _unicode_escapes(pattern: str) -> str:
    """``\\uXXXX`` as escaped UTF-8 bytes (see the module's docstring); other escapes are kept."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            hex_digits = pattern[i + 2:i + 6]
            if pattern[i + 1:i + 2] == "u" and len(hex_digits) == 4 and all(
                    c in "0123456789abcdefABCDEF" for c in hex_digits):
                out.append(_utf8_escape(chr(int(hex_digits, 16)), in_class, pattern))
                i += 6
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if char == "[" and not in_class:
            in_class = True
        elif char == "]" and in_class:
            in_class = False
        out.append(char)
        i += 1
    return "".join(out)


def _utf8_escape(char: str, in_class: bool, pattern: str) -> str:
    encoded = "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
    if ord(char) < 0x80:
        return encoded
    if in_class:
        raise re.error(f"a non-ASCII \\u escape in a character class: {pattern!r}")
    return f"(?:{encoded})"


def check_trigger_patterns(triggers: list[GrammarTrigger]) -> None:
    """Refuse, before generation, a pattern that does not compile (llama.cpp fails the sampler
    initialization on it)."""
    for trigger in triggers:
        pattern = pattern_of(trigger)
        if pattern is None:
            continue
        try:
            compile_pattern(pattern)
        except re.error as exc:
            raise EngineError(f"Failed to initialize samplers: invalid grammar trigger pattern "
                              f"{pattern!r}: {exc}") from None


def _ecmascript_end(pattern: str) -> str:
    """A final unescaped ``$`` as ``\\Z``: the end of the text only."""
    backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    if pattern.endswith("$") and backslashes % 2 == 0:
        return pattern[:-1] + r"\Z"
    return pattern


def pattern_of(trigger: GrammarTrigger) -> str | None:
    """The regex a pattern trigger searches with (None for words and tokens)."""
    if trigger.type == TRIGGER_PATTERN:
        return trigger.value
    if trigger.type == TRIGGER_PATTERN_FULL:
        return anchored(trigger.value)
    return None


def _word_search(word: bytes) -> Search:
    def search(buffer: bytearray, before: int) -> int | None:
        if not word:
            return 0
        # an occurrence ending before the new piece would have fired already
        found = buffer.find(word, max(0, before - len(word) + 1))
        return found if found >= 0 else None

    return search


def _pattern_search(pattern: str) -> Search:
    regex = compile_pattern(pattern)
    whole = pattern.startswith("^") and pattern.endswith("$")
    # anchored at both ends with no alternation, searching finds nothing a full match did not:
    # skip it, the full match of a long text is the costly part
    search_too = not whole or "|" in pattern or _ecmascript_end(pattern) == pattern

    def search(buffer: bytearray, before: int) -> int | None:
        match = regex.fullmatch(buffer) if whole else None
        if match is None and search_too:
            match = regex.search(buffer)
        if match is None:
            return None
        for group in range(1, (regex.groups or 0) + 1):
            start, end = match.span(group)
            if end > start:
                return start
        return match.start()

    return search


class TriggerScanner:
    """One sequence's wait for its triggers, fed each generated token until one fires."""

    __slots__ = ("trigger_tokens", "searches", "piece", "buffer", "ids", "starts")

    def __init__(self, triggers: list[GrammarTrigger], piece: Callable[[int], bytes]):
        self.trigger_tokens = frozenset(t.token for t in triggers if t.type == TRIGGER_TOKEN)
        self.searches: list[Search] = []
        for trigger in triggers:
            if trigger.type == TRIGGER_WORD:
                self.searches.append(_word_search(trigger.value.encode("utf-8")))
            elif (pattern := pattern_of(trigger)) is not None:
                self.searches.append(_pattern_search(pattern))
        self.piece = piece
        self.buffer = bytearray()
        self.ids: list[int] = []
        self.starts: list[int] = []

    def feed(self, token: int) -> Fired | None:
        """Take one generated token; what the grammar starts from once a trigger fires."""
        if token in self.trigger_tokens:
            return Fired(b"", [token])
        before = len(self.buffer)
        self.ids.append(token)
        self.starts.append(before)
        self.buffer += self.piece(token)
        for search in self.searches:
            start = search(self.buffer, before)
            if start is not None:
                return self._from(start)
        return None

    def _from(self, start: int) -> Fired:
        head = b""
        tokens: list[int] = []
        ends = self.starts[1:] + [len(self.buffer)]
        for token, token_start, token_end in zip(self.ids, self.starts, ends):
            if token_end <= start:
                continue
            if token_start < start:
                head = bytes(self.buffer[start:token_end])
            else:
                tokens.append(token)
        return Fired(head, tokens)
