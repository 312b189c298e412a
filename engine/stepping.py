"""Stepping: one ``BatchGenerator`` step (a prefill chunk for sequences still reading their
prompt, one batched decode for the rest), progress events, and llama.cpp's process_token rules
for each sampled token. Methods of ``Engine`` (engine/scheduler.py)."""

from __future__ import annotations

import itertools
import logging
import time

import mlx.core as mx

from .batching import size_prefill_wave
from .tasks import Task
from .text import first_invalid_utf8
from .types import (
    BAD_OUTPUT_MESSAGE,
    EngineError,
    ErrorEvent,
    ProgressEvent,
    SamplingParams,
    Timings,
    TokenEvent,
    TokenProb,
    TokenProbs,
)

log = logging.getLogger("mlxray.engine")


class Stepping:
    def _clock(self) -> float:
        """The time a token arrives at, for its timings and the time limit (engine/lockstep.py
        gives every rank rank 0's clock, so a time limit stops a sequence on every rank)."""
        return time.perf_counter()

    def _progress(self, task: Task, processed: int) -> ProgressEvent:
        now = time.perf_counter()
        if processed > task.n_cache:
            task.t_prompt = now
        timings = None
        if task.req.timings_per_token:
            timings = Timings(task.n_cache, processed - task.n_cache,
                              (task.t_prompt - task.t_start) * 1e3 if task.t_prompt else 0.0,
                              0, 0.0)
        return ProgressEvent(task.req.index, task.n_prompt, task.n_cache, processed,
                             int((now - task.t_start) * 1e3), timings)

    def _step(self) -> None:
        try:
            if self.config.prefill_waves:
                size_prefill_wave(self._bg, self.config.n_batch)
            else:  # every waiting prompt at once, up to the slots
                self._bg.prefill_batch_size = self.config.n_parallel
            prompt_responses, generation_responses = self._bg.next()
        except Exception as exc:  # a failed batch fails the sequences in it, not the loop
            log.exception("batch step failed")
            self._fail_active(f"decode() failed: {exc}")
            self._bg = self._new_batch_generator()
            return
        self.metrics.on_decode(self.n_active)
        for task in [t for t in self._by_uid.values() if t.fault is not None]:
            self._fail_group(task.group, f"got exception: {task.fault}")
        for r in prompt_responses:
            task = self._by_uid.get(r.uid)
            if task is None:
                continue
            done, total = r.progress
            if task.parent is not None:  # a child's one token: its prompt was its parent's
                if task.req.return_progress and task.req.stream and r.end_of_prompt:
                    self._emit(task, self._progress(task, task.n_prompt))
                continue
            task.t_prompt = time.perf_counter()
            if r.end_of_segment and not r.end_of_prompt:
                self._at_cut(task, task.n_cache + done)
            if task.req.return_progress and task.req.stream:
                # BatchGenerator feeds the last prompt token apart; report the reference's chunks
                if r.end_of_prompt or done < total - 1 or done % self.config.n_batch == 0:
                    self._emit(task, self._progress(task, task.n_cache + done))
        finished: list[Task] = []
        for r in generation_responses:  # a speculative step answers several tokens a row
            task = self._by_uid.get(r.uid)
            if task is None or task in finished:
                continue
            try:
                self._on_token(task, r.token)
            except Exception as exc:  # one bad sequence fails alone
                log.exception("token processing failed")
                task.group.sink([ErrorEvent(task.req.index, 500, f"got exception: {exc}",
                                            "server_error")])
                task.stop_type = "error"
            if task.stop_type is not None or r.finish_reason is not None:
                if task.stop_type is None:
                    task.stop_type, task.truncated = "limit", True
                finished.append(task)
        for task in finished:
            self._retire(task, emit=task.stop_type != "error")

    def _on_token(self, task: Task, token: int) -> None:
        """llama.cpp's process_token: text, stop word, limits, n_indent, time limit, EOG."""
        req = task.req
        recorded = task.recorded.popleft() if task.recorded else None
        now = self._clock()
        task.n_gen += 1
        if task.n_gen == 1:
            task.t_first = task.t_prompt = now
        task.t_last = now
        task.tokens.append(token)
        is_eog = token in self.vocab.eog_ids
        had_new_line = task.text.has_new_line
        # preserved tokens (special ones a tool-call grammar names) are rendered as text
        piece = self.vocab.piece(token, special=token in req.preserved_tokens)
        complete, sent = task.text.add(piece, is_eog)
        if task.text.stopping_word is not None:
            task.stop_type = "word"
        if complete:
            probs = self._probs(token, sent, recorded, req.sampling) if (
                req.sampling.n_probs > 0) else None
            if probs is not None:
                task.probs.append(probs)
            if req.stream and first_invalid_utf8(task.text.generated) == 0:
                task.stop_type = "error"  # the reference's partial parse fails at offset 0
                self._emit(task, ErrorEvent(req.index, 500, BAD_OUTPUT_MESSAGE, "server_error"))
                return
            if req.stream:
                timings = task.timings() if (req.timings_per_token or task.stop_type) else None
                self._emit(task, TokenEvent(req.index, token, sent.decode("utf-8", "replace"),
                                            task.n_gen, task.n_prompt, timings, probs,
                                            (task.parent or task).n_cache))
        if task.n_prompt + task.n_gen >= self.config.n_ctx:
            task.stop_type, task.truncated = "limit", True
        if task.stop_type is None and req.n_predict != -1 and task.n_gen >= req.n_predict:
            task.stop_type = "limit"
        if had_new_line and req.n_indent > 0 and task.text.indent_cut(req.n_indent):
            task.stop_type = "limit"
        if b"\n" in sent:
            task.text.has_new_line = True
            if 0 < req.t_max_predict_ms < (now - task.t_first) * 1e3:
                task.stop_type = "limit"
        if is_eog:
            task.stop_type = "eos"
        if task.grammar is not None and task.grammar.error:
            # every token the grammar allowed was banned (logit_bias): the sequence fails alone
            raise EngineError(f"the output does not match the grammar: {task.grammar.error}")

    def _probs(self, token: int, sent: bytes, recorded: mx.array | None,
               sampling: SamplingParams) -> TokenProbs:
        if sampling.post_sampling_probs:
            return self._post_sampling_probs(token, sent, recorded, sampling.n_probs)
        logprobs = recorded.reshape(-1).astype(mx.float32)
        logprobs = logprobs - mx.logsumexp(logprobs)
        top_ids, top_vals = _top(logprobs, sampling.n_probs)
        chosen = logprobs[token].item()
        top = [TokenProb(i, self.vocab.piece(i), v) for i, v in zip(top_ids, top_vals)]
        return TokenProbs(token, sent, chosen if chosen > float("-inf") else -3.4028234663852886e38,
                          top)

    def _post_sampling_probs(self, token: int, sent: bytes, recorded: mx.array | None,
                             n: int) -> TokenProbs:
        """The candidates after the draw, most likely first, cut at the first zero; greedy
        sampling leaves one candidate."""
        if recorded is None:  # the shared greedy path records nothing: its one candidate
            return TokenProbs(token, sent, 1.0, [TokenProb(token, self.vocab.piece(token), 1.0)])
        probs = recorded.reshape(-1).astype(mx.float32)
        top_ids, top_vals = _top(probs, n)
        top = [TokenProb(i, self.vocab.piece(i), v)
               for i, v in itertools.takewhile(lambda c: c[1] > 0.0, zip(top_ids, top_vals))]
        return TokenProbs(token, sent, probs[token].item(), top)


def _top(values: mx.array, n: int) -> tuple[list[int], list[float]]:
    """The ``n`` largest values of a vector, largest first, with their indices."""
    n = min(n, values.shape[-1])
    ids = mx.argpartition(-values, n - 1)[:n]
    order = mx.argsort(-values[ids])
    ids = ids[order]
    return ids.tolist(), values[ids].tolist()
