"""llama-server's native response objects, built from engine events (spec §3, §4).

One function builds the final result object; the streaming path's final frame is built by it too.
Keys are inserted in the reference's order, because clients (and the captures) see that order.
"""

from __future__ import annotations

import json
from typing import Any

from engine.types import FinalEvent, ProgressEvent, Timings, TokenEvent, TokenProbs

from .schema import CompletionParams

FLT_MAX = 3.4028234663852886e38


def dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8 unescaped, as the reference's dump_safe writes it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def timings_json(t: Timings) -> dict:
    prompt_n, predicted_n = t.prompt_n, t.predicted_n
    prompt_ms, predicted_ms = t.prompt_ms, t.predicted_ms
    return {
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


def generation_settings(p: CompletionParams, only_metrics: bool = False) -> dict:
    """task_params::to_json: the effective settings, in the reference's key order."""
    out: dict[str, Any] = {
        "seed": p.seed,
        "temperature": p.temperature,
        "dynatemp_range": p.dynatemp_range,
        "dynatemp_exponent": p.dynatemp_exponent,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "top_n_sigma": p.top_n_sigma,
        "xtc_probability": p.xtc_probability,
        "xtc_threshold": p.xtc_threshold,
        "typical_p": p.typical_p,
        "repeat_last_n": p.repeat_last_n,
        "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": p.dry_multiplier,
        "dry_base": p.dry_base,
        "dry_allowed_length": p.dry_allowed_length,
        "dry_penalty_last_n": p.dry_penalty_last_n,
    }
    if not only_metrics:
        out["dry_sequence_breakers"] = list(p.dry_sequence_breakers)
    out.update({
        "mirostat": p.mirostat,
        "mirostat_tau": p.mirostat_tau,
        "mirostat_eta": p.mirostat_eta,
        "adaptive_target": p.adaptive_target,
        "adaptive_decay": p.adaptive_decay,
    })
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
        "speculative.types": "none",
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
