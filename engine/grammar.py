"""Constrained decoding with llguidance: grammar strings in, one token mask per step out.

A grammar string is llama.cpp's: GBNF, or Lark when it starts with ``%llguidance`` (what a
llama.cpp built with LLGuidance accepts). Compiling is paid once per distinct grammar: the
``GrammarCache`` keeps a template matcher per grammar and every sequence gets a cheap deep copy.
The ``GrammarProcessor`` is an mlx-lm logits processor: at each decode step it consumes the token
sampled at the previous step, then masks every token the grammar does not allow next (EOS only
when the grammar accepts). A lazy grammar (``grammar_lazy``) leaves the logits alone until its
trigger scanner (``engine/triggers.py``) fires, then starts from the text of the trigger on; with
a reasoning budget it is also held off (neither fed nor masking) while the budget is active.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import mlx.core as mx
import numpy as np

from .grammar_text import GrammarError, json_lark, json_schema_grammar, to_lark
from .triggers import TriggerScanner

if TYPE_CHECKING:
    from .reasoning_budget import BudgetState

# json_schema_grammar is re-exported: the grammar's users need not know where strings are made
__all__ = ["GrammarCache", "GrammarError", "GrammarProcessor", "json_lark", "json_schema_grammar",
           "to_lark"]
NEG_INF = float("-inf")


class GrammarCache:
    """Compiled grammars for one vocabulary, least recently used first out (thread-safe)."""

    def __init__(self, hf_tokenizer: Any, n_vocab: int, eos_ids: set[int], size: int = 32):
        self._hf = hf_tokenizer
        self.n_vocab = n_vocab
        self.eos_ids = sorted(eos_ids)
        self.size = size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0

    def _lltokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:  # ~1 s for a 150k vocabulary: built on first use
            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf, n_vocab=self.n_vocab, eos_token=self.eos_ids or None)
        return self._tokenizer

    def template(self, grammar: str) -> llguidance.LLMatcher:
        """The compiled grammar; raises GrammarError if it does not parse or compile."""
        with self._lock:
            found = self._templates.get(grammar)
            if found is not None:
                self._templates.move_to_end(grammar)
                return found
            lark = to_lark(grammar)
            matcher = llguidance.LLMatcher(self._lltokenizer(),
                                           llguidance.LLMatcher.grammar_from_lark(lark),
                                           log_level=0)
            if matcher.is_error():
                raise GrammarError(matcher.get_error())
            self.compiles += 1
            self._templates[grammar] = matcher
            if len(self._templates) > self.size:
                self._templates.popitem(last=False)
            return matcher

    def processor(self, grammar: str, waiting: TriggerScanner | None = None,
                  hold: BudgetState | None = None) -> GrammarProcessor:
        """A fresh matcher for one sequence; lazy (free until a trigger fires) with ``waiting``,
        held off while the reasoning budget ``hold`` is active."""
        return GrammarProcessor(self.template(grammar).deep_copy(), self.n_vocab, self.eos_ids,
                                waiting, self._lltokenizer().tokenize_bytes, hold)


class GrammarProcessor:
    """mlx-lm logits processor for one sequence. mlx-lm calls it once per decode step with the
    context whose last token is the one sampled at the previous step (a prompt token the first
    time), so it consumes that token before computing the next mask. A lazy one hands the
    tokens to its trigger scanner instead and leaves the logits alone until a trigger fires.
    With ``hold`` (the reasoning budget, whose processor runs first), a token the budget took
    while active is not fed, and no mask is applied while it is active."""

    __slots__ = ("matcher", "n_vocab", "eos_ids", "started", "waiting", "tokenize_bytes",
                 "hold", "_bits")

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int, eos_ids: list[int],
                 waiting: TriggerScanner | None = None,
                 tokenize_bytes: Callable[[bytes], list[int]] | None = None,
                 hold: BudgetState | None = None):
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.eos_ids = eos_ids
        self.started = False
        self.waiting = waiting
        self.tokenize_bytes = tokenize_bytes
        self.hold = hold
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    @property
    def error(self) -> str:
        """llguidance's reason, its first line (the rest is a parser state dump)."""
        return self.matcher.get_error().split("\n", 1)[0] if self.matcher.is_error() else ""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.started:
            self._take(int(tokens[-1].item()))
        self.started = True
        if self.waiting is not None or (self.hold is not None and self.hold.active):
            return logits
        allowed = self.allowed()
        width = logits.shape[-1]
        if width > self.n_vocab:  # the model's padded rows are never allowed
            allowed = np.concatenate([allowed, np.zeros(width - self.n_vocab, dtype=bool)])
        return mx.where(mx.array(allowed[:width]), logits, NEG_INF)

    def _take(self, token: int) -> None:
        hold = self.hold
        if hold is None:
            self.consume(token)
            return
        for replayed in hold.replay:  # the end tag that just ended the budget
            self.consume(replayed)
        if not hold.held_last:
            self.consume(token)

    def prefill(self, tokens: list[int]) -> int | None:
        """Tokens the grammar accepts before generation (the generation prompt's); the first one
        it does not accept, or None."""
        for token in tokens:
            if not self.matcher.consume_token(token) or self.matcher.is_error():
                return token
        return None

    def consume(self, token: int) -> None:
        """One generated token: to the matcher, or to the scanner while it waits (the text from
        the trigger on goes to the matcher when one fires)."""
        if self.waiting is None:
            self.matcher.consume_token(token)
            return
        fired = self.waiting.feed(token)
        if fired is None:
            return
        self.waiting = None
        head = self.tokenize_bytes(fired.head) if fired.head and self.tokenize_bytes else []
        self.matcher.consume_tokens(head + fired.tokens)  # stops with an error at a misfit

    def allowed(self) -> np.ndarray:
        """A bool per vocabulary id; after an error only EOS, so the sequence ends at once."""
        if self.matcher.is_error():
            mask = np.zeros(self.n_vocab, dtype=bool)
            mask[self.eos_ids] = True
            return mask
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self.n_vocab].view(
            bool)
