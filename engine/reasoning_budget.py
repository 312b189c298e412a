"""llama.cpp's reasoning budget (common/reasoning-budget) as a logits processor.

A budget is idle until its start tag is generated, then counts the tokens that follow; when they
run out (and the last one ends a UTF-8 character) it forces its end sequence one token at a
time. Generating an end tag first ends it naturally. A start tag after the end opens it again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from .sampling import NEG_INF, LogitsProcessor
from .types import ReasoningBudget

IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting_utf8", "forcing", "done"
WHITESPACE = b" \t\n\v\f\r"


def piece_ends_character(piece: bytes) -> bool:
    """common_utf8_is_complete on one token's piece: it ends on a character boundary (a piece of
    continuation bytes only does not)."""
    for back in range(1, min(4, len(piece)) + 1):
        byte = piece[-back]
        if byte & 0xC0 != 0x80:
            need = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
            return back >= need
    return not piece


class TagMatcher:
    """Sees any of several token sequences end in a token stream, and then forgets what it has
    seen (what llama.cpp's Aho-Corasick matcher reports, matching from its root again)."""

    def __init__(self, sequences: list[list[int]]):
        self.sequences = {tuple(s) for s in sequences if s}
        self.recent: deque[int] = deque(maxlen=max(map(len, self.sequences), default=1))
        self.matched: tuple[int, ...] = ()  # the sequence seen last

    def advance(self, token: int) -> bool:
        self.recent.append(token)
        tail = tuple(self.recent)
        for sequence in self.sequences:
            if tail[-len(sequence):] == sequence:
                self.recent.clear()
                self.matched = sequence
                return True
        return False

    def reset(self) -> None:
        self.recent.clear()


@dataclass
class BudgetState:
    """One sequence's reasoning budget: ``accept`` each generated token, then ``forced_token``
    says which token the next step must take (None: any). A lazy grammar is held off while the
    budget is ``active`` (llama.cpp's grammar_should_apply): it is not fed a token accepted while
    active (``held_last``), but is fed the end tag that ended the budget (``replay``)."""

    budget: int
    start: TagMatcher
    end: TagMatcher
    forced: list[int]
    pieces: list[bytes] = field(repr=False)  # per token id, special ones empty: UTF-8 check
    phase: str = IDLE
    remaining: int = 0
    force_pos: int = 0
    held_last: bool = False
    replay: tuple[int, ...] = ()
    force_pending: bool = False  # the control route's reasoning_end, applied at the next accept

    @property
    def active(self) -> bool:
        return self.phase in (COUNTING, WAITING_UTF8, FORCING)

    def accept(self, token: int) -> None:
        self.held_last, self.replay = self.active, ()
        self._advance(token)
        if self.force_pending:
            self.force_pending = False
            if self.phase == COUNTING:
                self._force()

    def _advance(self, token: int) -> None:
        if self.phase in (IDLE, DONE):
            if self.start.advance(token):
                self._open()
        elif self.phase in (COUNTING, WAITING_UTF8):
            if self.end.advance(token):
                self.phase, self.replay = DONE, self.end.matched
            elif self.phase == COUNTING:
                self.remaining -= 1
                if self.remaining <= 0 and self._ends_character(token):
                    self._force()
                elif self.remaining <= 0:
                    self.phase = WAITING_UTF8
                    self.end.reset()
            elif self._ends_character(token):
                self._force()
        elif self.phase == FORCING:
            self.force_pos += 1
            if self.force_pos >= len(self.forced):
                self.phase = DONE

    def force_now(self) -> bool:
        """The control route's ``reasoning_end``: a budget counting down is spent (its message
        and end tag are forced next); in any other phase nothing changes. The processor accepts
        each token at the next step, so the force waits for the token already sampled to be
        accepted as what it is (forcing now would count it as the message's first token)."""
        if self.phase != COUNTING:
            return False
        self.force_pending = True
        return True

    def forced_token(self) -> int | None:
        if self.phase == FORCING and self.force_pos < len(self.forced):
            return self.forced[self.force_pos]
        return None

    def _ends_character(self, token: int) -> bool:
        return piece_ends_character(self.pieces[token] if 0 <= token < len(self.pieces) else b"")

    def _open(self) -> None:
        self.phase, self.remaining = COUNTING, self.budget
        self.end.reset()
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.phase, self.force_pos = FORCING, 0
        self.end.reset()


def prefill_tokens(generation_prompt: str, tokenize: Callable[[str], list[int]],
                   special_pieces: list[bytes]) -> list[int]:
    """The generation prompt's tokens, less a first token that only a tokenizer's leading space
    put there (common_sampler_init's prefill)."""
    tokens = tokenize(generation_prompt) if generation_prompt else []
    if tokens and _starts_with_space(special_pieces[tokens[0]]) and not _starts_with_space(
            generation_prompt.encode()):
        tokens = tokens[1:]
    return tokens


def _starts_with_space(text: bytes) -> bool:
    return bool(text) and text[0] in WHITESPACE


def budget_state(rb: ReasoningBudget, pieces: list[bytes], prefill: list[int]) -> BudgetState:
    state = BudgetState(rb.tokens, TagMatcher([rb.start]), TagMatcher(rb.ends), list(rb.forced),
                        pieces)
    for token in prefill:
        state.accept(token)
    return state


def reasoning_budget_processor(state: BudgetState) -> LogitsProcessor:
    """The budget as a logits processor (llama.cpp applies it first, to the raw logits): mlx-lm
    passes the context, which ends with a prompt token at the first step and then with the token
    sampled at the step before, accepted here; while forcing, every other token gets -inf."""
    started = False

    def apply(tokens: mx.array, logits: mx.array) -> mx.array:
        nonlocal started
        if started:
            state.accept(int(tokens[-1].item()))
        started = True
        forced = state.forced_token()
        if forced is None:
            return logits
        return mx.where(mx.arange(logits.shape[-1]) == forced, logits, NEG_INF)

    return apply
