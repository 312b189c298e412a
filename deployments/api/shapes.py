"""llama-server's native response objects, built from engine events (spec §3, §4).

One function builds the final result object; the streaming path's final frame is built by it too.
Keys are inserted in the reference's order, because clients (and the captures) see that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.api.framing import Framing, dumps, sse  # noqa: F401 - dumps and sse are imported from here too
from deployments.api.schema import CompletionParams
from engine.sampler_fields import by_settings
from engine.types import FinalEvent, ProgressEvent, Timings, TokenEvent, TokenProbs

FLT_MAX = 3.4028234663852886e38


def timings_json(t: Timings) -> dict:
    prompt_n, predicted_n = t.prompt_n, t.predicted_n
    prompt_ms, predicted_ms = t.prompt_ms, t.predicted_ms
    out = {
        "cache_n": t.cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n > 0 else 0.0,
        "prompt_per_second": 1e3 / prompt_ms * prompt_n if prompt_n > 0 and prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / (predicted_n - 1) if predicted_n > 1 else 0.0,
        "predicted_per_second": (
            1e3 / predicted_ms * (predicted_n - 1) if predicted_n > 1 and predicted_ms > 0 else 0.0
        ),
    }
    if t.draft_n > 0:  # server_slot_stats::to_json
        out.update(draft_n=t.draft_n, draft_n_accepted=t.draft_n_accepted)
    return out


def generation_settings(p: CompletionParams, only_metrics: bool = False) -> dict:
    """task_params::to_json: the effective settings, in the reference's key order."""
    before, after = by_settings()  # the sampler table's rows (engine/sampler_fields.py)
    out: dict[str, Any] = {"seed": p.seed, **{f.name: getattr(p, f.name) for f in before}}
    if not only_metrics:
        out["dry_sequence_breakers"] = list(p.dry_sequence_breakers)
    out.update({f.name: getattr(p, f.name) for f in after})
    if not only_metrics:
        out["stop"] = list(p.stop)
    out.update({
        "max_tokens": p.n_predict,
        "n_predict": p.n_predict,
        "n_keep": p.n_keep,
        "n_discard": p.n_discard,
        "ignore_eos": p.ignore_eos,
        "stream": p.stream,
    })
    if not only_metrics:
        out["logit_bias"] = [{"bias": b, "token": t} for t, b in p.logit_bias]
    out.update({"n_probs": p.n_probs, "min_keep": p.min_keep})
    if not only_metrics:
        out.update({
            "grammar": p.grammar,
            "grammar_lazy": p.grammar_lazy,
            "grammar_triggers": list(p.grammar_triggers),
            "preserved_tokens": list(p.preserved_tokens),
        })
    out.update({
        "chat_format": "Content-only",
        "reasoning_format": p.reasoning_format,
        "reasoning_in_content": False,
        "generation_prompt": p.generation_prompt,
        "samplers": list(p.samplers),
        "speculative.types": p.speculative_types,
        "timings_per_token": p.timings_per_token,
        "post_sampling_probs": p.post_sampling_probs,
        "backend_sampling": p.backend_sampling,
        "lora": [dict(x) for x in p.lora],
    })
    return out


def _probs_json(probs: TokenProbs, post_sampling: bool) -> dict:
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")
    return {
        "id": probs.id,
        "token": _valid_utf8_prefix(probs.text),
        "bytes": list(probs.text),
        key: probs.logprob,
        top_key: [
            {"id": c.id, "token": _valid_utf8_prefix(c.piece), "bytes": list(c.piece),
             key: c.logprob if c.logprob > float("-inf") else -FLT_MAX}
            for c in probs.top
        ],
    }


def _valid_utf8_prefix(data: bytes) -> str:
    """The token text with trailing incomplete bytes dropped; invalid bytes become U+FFFD."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace")


def final_result(ev: FinalEvent, p: CompletionParams, model: str, stream: bool) -> dict:
    """to_json_non_oaicompat of the final result; the stream's last frame has no text or tokens."""
    out: dict[str, Any] = {
        "index": ev.index,
        "content": "" if stream else ev.content,
        "tokens": [] if stream or not p.return_tokens else list(ev.tokens),
        "id_slot": ev.id_slot,
        "stop": True,
        "model": model,
        "tokens_predicted": ev.n_predicted,
        "tokens_evaluated": ev.n_prompt,
        "generation_settings": generation_settings(p),
        "prompt": ev.prompt,
        "has_new_line": ev.has_new_line,
        "truncated": ev.truncated,
        "stop_type": ev.stop_type,
        "stopping_word": ev.stopping_word,
        "tokens_cached": ev.tokens_cached,
        "timings": timings_json(ev.timings),
    }
    if not stream and ev.probs:
        out["completion_probabilities"] = [_probs_json(x, p.post_sampling_probs) for x in ev.probs]
    if p.response_fields:
        return project(out, p.response_fields)
    return out


def project(obj: dict, paths: list[str]) -> dict:
    """response_fields: slash paths become keys named by the whole path; missing ones vanish."""
    out: dict[str, Any] = {}
    for path in paths:
        if path in out:
            continue
        node: Any = obj
        for part in path.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[path] = node
    return out


def token_frame(ev: TokenEvent, p: CompletionParams) -> dict:
    out: dict[str, Any] = {
        "index": ev.index,
        "content": ev.text,
        "tokens": [ev.token],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": ev.n_predicted,
        "tokens_evaluated": ev.n_prompt,
    }
    if ev.timings is not None:
        out["timings"] = timings_json(ev.timings)
    if ev.probs is not None:
        out["completion_probabilities"] = [_probs_json(ev.probs, p.post_sampling_probs)]
    return out


def progress_frame(ev: ProgressEvent) -> dict:
    out: dict[str, Any] = {
        "index": ev.index,
        "content": "",
        "tokens": [0],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": 0,
        "tokens_evaluated": ev.total,
    }
    if ev.timings is not None:
        out["timings"] = timings_json(ev.timings)
    out["prompt_progress"] = {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
                              "time_ms": ev.time_ms}
    return out


# ---- OpenAI shapes (text_completion, chat.completion) -------------------------------------
@dataclass
class OaiContext:
    """What an OpenAI-shaped answer needs besides the events: its id, time, model, and the
    client's switches."""

    object: str  # "text_completion" or "chat.completion"
    id: str
    created: int
    model: str
    system_fingerprint: str
    include_usage: bool = False
    verbose: bool = False
    chat: Any = None  # the chat request's ChatSyntax (deployments/api/tools): its output is parsed
    protocol: str = ""  # "responses" or "messages": the chat answer converted (protocols/)


def oai_usage(ev: FinalEvent) -> dict:
    """usage_json_oaicompat: the answer's and the stream's last chunk's alike."""
    return {
        "completion_tokens": ev.n_predicted,
        "prompt_tokens": ev.n_prompt,
        "total_tokens": ev.n_predicted + ev.n_prompt,
        "prompt_tokens_details": {"cached_tokens": ev.timings.cache_n},
    }


def finish_reason(ev: FinalEvent) -> str:
    return "stop" if ev.stop_type in ("word", "eos") else "length"


def _oai_logprobs(probs: list[TokenProbs], p: CompletionParams) -> dict | None:
    if not probs:
        return None
    return {"content": [_probs_json(x, p.post_sampling_probs) for x in probs]}


def _envelope(ctx: OaiContext, choices: list, chunk: bool) -> dict:
    """Non-stream answers and completion chunks: choices, created, model, fingerprint, object;
    chat chunks put id before model."""
    if chunk and ctx.object == "chat.completion":
        return {"choices": choices, "created": ctx.created, "id": ctx.id, "model": ctx.model,
                "system_fingerprint": ctx.system_fingerprint,
                "object": "chat.completion.chunk"}
    return {"choices": choices, "created": ctx.created, "model": ctx.model,
            "system_fingerprint": ctx.system_fingerprint, "object": ctx.object}


class OaiCompletionShape(Framing):
    """/v1/completions: one builder for the answer, the token chunks and the last chunk."""

    done = b"data: [DONE]\n\n"

    def __init__(self, p: CompletionParams, ctx: OaiContext):
        self.p, self.ctx = p, ctx

    def final(self, ev: FinalEvent, stream: bool) -> list[dict]:
        choice = {"text": "" if stream else ev.content, "index": ev.index,
                  "logprobs": None if stream else _oai_logprobs(ev.probs, self.p),
                  "finish_reason": finish_reason(ev)}
        return [self._answer(ev, choice, stream)]

    def _answer(self, ev: FinalEvent, choice: dict, stream: bool) -> dict:
        """The final object around one choice: usage, id, the native result when verbose,
        timings (the keys in the reference's order)."""
        out = _envelope(self.ctx, [choice], chunk=False)
        out["usage"] = oai_usage(ev)
        out["id"] = self.ctx.id
        if self.ctx.verbose:
            out["__verbose"] = final_result(ev, self.p, self.ctx.model, stream)
        out["timings"] = timings_json(ev.timings)
        return out

    def token(self, ev: TokenEvent) -> list[dict]:
        logprobs = _oai_logprobs([ev.probs], self.p) if ev.probs is not None else None
        choice = {"text": ev.text, "index": ev.index, "logprobs": logprobs,
                  "finish_reason": None}
        out = _envelope(self.ctx, [choice], chunk=True)
        out["id"] = self.ctx.id
        if ev.timings is not None:
            out["timings"] = timings_json(ev.timings)
        return [out]

    def progress(self, ev: ProgressEvent) -> list[dict]:
        out = _envelope(self.ctx, [], chunk=True)
        out["id"] = self.ctx.id
        out["prompt_progress"] = progress_frame(ev)["prompt_progress"]
        return [out]

    def merge(self, results: list[dict]) -> dict:
        return merge_choices(results)


class OaiChatShape(OaiCompletionShape):
    """/v1/chat/completions: message answers, delta chunks (role first), usage chunk."""

    def final(self, ev: FinalEvent, stream: bool) -> list[dict]:
        if stream:
            return self._final_chunks(ev, finish_reason(ev))
        message = {"role": "assistant", "content": ev.content}
        return [self._answer(ev, self._choice(ev, finish_reason(ev), message), stream)]

    def _choice(self, ev: FinalEvent, finish: str, message: dict) -> dict[str, Any]:
        choice: dict[str, Any] = {"finish_reason": finish, "index": ev.index, "message": message}
        logprobs = _oai_logprobs(ev.probs, self.p)
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return choice

    def _probs(self, probs: list[TokenProbs]) -> list[dict]:
        return [_probs_json(x, self.p.post_sampling_probs) for x in probs]

    def _final_chunks(self, ev: FinalEvent, finish: str) -> list[dict]:
        frames = [_envelope(self.ctx, [{"finish_reason": finish, "index": ev.index,
                                        "delta": {}}], chunk=True)]
        if self.ctx.include_usage:
            usage = _envelope(self.ctx, [], chunk=True)
            usage["usage"] = oai_usage(ev)
            frames.append(usage)
        frames[-1]["timings"] = timings_json(ev.timings)
        if self.ctx.verbose:
            frames[0]["__verbose"] = final_result(ev, self.p, self.ctx.model, stream=True)
        return frames

    def token(self, ev: TokenEvent) -> list[dict]:
        frames = []
        if ev.n_predicted == 1:
            frames.append(self._delta(ev.index, {"role": "assistant", "content": None}))
        if ev.text:
            frame = self._delta(ev.index, {"content": ev.text})
            if ev.probs is not None:
                frame["choices"][0]["logprobs"] = _oai_logprobs([ev.probs], self.p)
            frames.append(frame)
        if frames and ev.timings is not None:
            frames[-1]["timings"] = timings_json(ev.timings)
        return frames

    def _delta(self, index: int, delta: dict) -> dict:
        return _envelope(self.ctx, [{"finish_reason": None, "index": index, "delta": delta}],
                         chunk=True)


def merge_choices(answers: list[dict]) -> dict:
    """A non-stream answer for n > 1 (or several prompts): one object, every choice in index
    order, usage summed."""
    out = dict(answers[0])
    out["choices"] = [c for a in answers for c in a["choices"]]
    usage = {k: sum(a["usage"][k] for a in answers)
             for k in ("completion_tokens", "prompt_tokens", "total_tokens")}
    usage["prompt_tokens_details"] = {
        "cached_tokens": sum(a["usage"]["prompt_tokens_details"]["cached_tokens"]
                             for a in answers)}
    out["usage"] = usage
    return out


class NativeShape(Framing):
    """llama-server's own objects (/completion): the same interface as the OpenAI shapes."""

    def __init__(self, p: CompletionParams, model: str):
        self.p, self.model = p, model

    def final(self, ev: FinalEvent, stream: bool) -> list[dict]:
        return [final_result(ev, self.p, self.model, stream)]

    def token(self, ev: TokenEvent) -> list[dict]:
        return [token_frame(ev, self.p)]

    def progress(self, ev: ProgressEvent) -> list[dict]:
        return [progress_frame(ev)]
