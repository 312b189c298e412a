"""Generated text as llama.cpp builds it: the concatenation of token pieces (bytes), released as
complete UTF-8 only, with stop strings matched and partial matches held back (spec §5.6)."""

from __future__ import annotations

from dataclasses import dataclass, field


def utf8_incomplete_tail(buf: bytes | bytearray) -> bool:
    """True when ``buf`` ends inside a multi-byte UTF-8 sequence that more bytes could complete."""
    n = len(buf)
    for back in range(1, min(4, n) + 1):
        byte = buf[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        if byte & 0xE0 == 0xC0:
            need = 2
        elif byte & 0xF0 == 0xE0:
            need = 3
        elif byte & 0xF8 == 0xF0:
            need = 4
        else:
            return False
        return back < need
    return False


def first_invalid_utf8(buf: bytes | bytearray) -> int | None:
    """Where ``buf`` stops being valid UTF-8; an incomplete trailing sequence is tolerated."""
    try:
        bytes(buf).decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.end == len(buf) and utf8_incomplete_tail(buf):
            return None
        return exc.start
    return None


def find_partial_stop(text: bytes, word: bytes) -> int:
    """Where ``text`` ends with a prefix of ``word`` (llama.cpp's string_find_partial_stop).

    Returns -1 when it does not.
    """
    if not text or not word:
        return -1
    last = text[-1]
    for i in range(len(word) - 1, -1, -1):
        if word[i] == last and text.endswith(word[: i + 1]):
            return len(text) - i - 1
    return -1


@dataclass(slots=True)
class TextState:
    """Per-sequence generated text with llama.cpp's stop-word, hold-back and n_indent rules."""

    stop_words: list[bytes]
    generated: bytearray = field(default_factory=bytearray)
    n_sent: int = 0
    has_new_line: bool = False
    last_nl_pos: int = 0
    stopping_word: bytes | None = None

    def add(self, piece: bytes, is_eog: bool) -> tuple[bool, bytes]:
        """Append one token's piece. Returns (complete, text_to_send).

        ``complete`` is False while the text ends in an incomplete UTF-8 sequence: then nothing is
        sent and the step records no token output. A full stop-word match sets ``stopping_word``.
        """
        self.generated += piece
        if utf8_incomplete_tail(self.generated):
            return False, b""
        pos = min(self.n_sent, len(self.generated))
        unsent = bytes(self.generated[pos:])
        send = True
        if self.stop_words:
            stop_pos = self._find_full_stop(unsent, len(piece))
            if stop_pos >= 0:
                del self.generated[pos + stop_pos :]
                pos = min(self.n_sent, len(self.generated))
            elif not is_eog:
                send = not any(find_partial_stop(unsent, w) >= 0 for w in self.stop_words)
        if not send:
            return True, b""
        out = bytes(self.generated[pos:])
        self.n_sent += len(out)
        return True, out

    def _find_full_stop(self, text: bytes, piece_len: int) -> int:
        best = -1
        for word in self.stop_words:
            start = max(0, len(text) - (len(word) + piece_len))
            found = text.find(word, start)
            if found >= 0 and (best < 0 or found < best):
                best = found
                self.stopping_word = word
        return best

    def indent_cut(self, n_indent: int) -> bool:
        """llama.cpp's n_indent rule (spec §5.1), run after each token once a newline was sent.

        Returns True (and cuts the text) when a line started with less indentation than required.
        """
        cut = False
        text = self.generated
        if self.last_nl_pos > 0:
            pos = self.last_nl_pos
            indent = 0
            while pos < len(text) and text[pos] in (0x20, 0x09):
                indent += 1
                pos += 1
            if pos < len(text) and indent < n_indent:
                del text[pos:]
                cut = True
        nl = text.find(b"\n", self.last_nl_pos)
        if nl >= 0:
            self.last_nl_pos = nl + 1
        return cut
