"""The project's own replay of the reference captures (tests/fixtures/captures), with the same
normalization rules as ../shared/reference/compare.py: timing values and ``model`` may differ,
``id_slot`` may be any slot where the reference names one, generated ids keep the reference's
prefix (``resp_``, ``msg_``, ``chatcmpl-``), times keep their JSON type, Anthropic usage keeps the
sum of cached and uncached input tokens, floats match to 1e-5 relative (probabilities to 5e-3
absolute), ``shape`` captures compare key order and JSON types only, and ``chain`` captures (one
sampled token with post_sampling_probs) compare in shape and, exactly, the candidates the sampler
chain leaves before the random draw and their probabilities (the first position's
``top_probs``; the drawn token depends on the random generator)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx

from compat.answers import parse_answer

TIMING_SUFFIXES = ("_ms", "_per_second", "_per_token_ms")
PROB_KEYS = {"logprob", "prob"}
GENERATED_IDS = {"id", "item_id", "call_id", "response_id"}
VARYING = {"created", "created_at", "completed_at", "system_fingerprint", "cached_tokens"}
ANTHROPIC_INPUT = {"cache_read_input_tokens", "input_tokens"}  # the split depends on the cache


def load_captures(folder: Path) -> list[dict]:
    caps = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    return sorted(caps, key=lambda c: c["probe"]["order"])


def send(client: httpx.Client, probe: dict) -> dict:
    headers = {"Content-Type": "application/json", **probe.get("headers", {})}
    if "raw" in probe:
        data = probe["raw"].encode()
    elif probe.get("body") is not None:
        data = json.dumps(probe["body"]).encode()
    else:
        data = None
    resp = client.request(probe.get("method", "POST"), probe["path"], content=data,
                          headers=headers)
    return parse_answer(resp.status_code, resp.headers.get("content-type", ""), resp.content)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def id_prefix(value: str) -> str:
    """The fixed part of a generated id: up to and including its first _ or -."""
    cut = min((i for i in (value.find("_"), value.find("-")) if i >= 0), default=-1)
    return value[:cut + 1] if cut >= 0 else ""


def diff(ref: Any, got: Any, path: str = "$", shape: bool = False, key: str = "") -> list[str]:
    if key == "model":
        return [] if isinstance(got, str) else [f"{path}: expected a string"]
    if key in GENERATED_IDS and isinstance(ref, str):
        ok = isinstance(got, str) and id_prefix(got) == id_prefix(ref)
        return [] if ok else [f"{path}: {got!r} does not start {id_prefix(ref)!r}"]
    if key in VARYING and ref is not None:
        ok = type(got) is type(ref) or (_number(ref) and _number(got))
        return [] if ok else [f"{path}: expected a {type(ref).__name__}, got {got!r}"]
    if key.endswith(TIMING_SUFFIXES) and _number(ref):
        return [] if _number(got) else [f"{path}: expected a number, got {got!r}"]
    if key == "id_slot" and isinstance(ref, int):
        ok = got == -1 if ref == -1 else isinstance(got, int) and got >= 0
        return [] if ok else [f"{path}: id_slot {got!r} (reference {ref})"]
    if isinstance(ref, dict):
        if not isinstance(got, dict):
            return [f"{path}: expected an object, got {type(got).__name__}"]
        if list(ref) != list(got):
            return [f"{path}: keys {list(got)} != reference {list(ref)}"]
        split = ANTHROPIC_INPUT <= ref.keys() and not shape
        out = []
        if split and not (all(isinstance(got[k], int) for k in ANTHROPIC_INPUT) and
                          sum(ref[k] for k in ANTHROPIC_INPUT) == sum(got[k] for k in
                                                                     ANTHROPIC_INPUT)):
            out.append(f"{path}: input tokens (cached + not) differ from the reference's")
        return out + [d for k in ref if not (split and k in ANTHROPIC_INPUT)
                      for d in diff(ref[k], got[k], f"{path}.{k}", shape, k)]
    if isinstance(ref, list):
        if not isinstance(got, list):
            return [f"{path}: expected a list, got {type(got).__name__}"]
        if shape:
            return diff(ref[0], got[0], f"{path}[0]", shape, key) if ref and got else []
        if len(ref) != len(got):
            return [f"{path}: {len(got)} items, reference {len(ref)}"]
        return [d for i, (r, g) in enumerate(zip(ref, got)) for d in
                diff(r, g, f"{path}[{i}]", shape, key)]
    if isinstance(ref, bool) or ref is None:
        if shape and isinstance(ref, bool):
            return [] if isinstance(got, bool) else [f"{path}: expected a boolean"]
        return [] if got is ref else [f"{path}: {got!r} != reference {ref!r}"]
    if _number(ref):
        if not _number(got):
            return [f"{path}: expected a number, got {got!r}"]
        if shape:
            return []
        if isinstance(ref, int) and isinstance(got, int):
            return [] if ref == got else [f"{path}: {got} != reference {ref}"]
        if key in PROB_KEYS:
            same = abs(ref - got) <= 5e-3
        else:
            same = math.isclose(ref, got, rel_tol=1e-5, abs_tol=1e-6)
        return [] if same else [f"{path}: {got} != reference {ref}"]
    if isinstance(ref, str):
        if not isinstance(got, str):
            return [f"{path}: expected a string, got {got!r}"]
        return [] if shape or ref == got else [f"{path}: {got!r} != reference {ref!r}"]
    return [] if ref == got else [f"{path}: {got!r} != reference {ref!r}"]


MODES = ("exact", "shape", "chain")


def compare(capture: dict, answer: dict) -> list[str]:
    ref = capture["answer"]
    mode = capture["probe"].get("mode", "exact")
    if mode not in MODES:
        raise ValueError(f"capture {capture['probe']['name']}: unknown mode {mode!r}")
    shape = mode == "shape"
    problems = []
    if ref["status"] != answer["status"]:
        problems.append(f"status {answer['status']} != reference {ref['status']}")
    if ref["content_type"] != answer["content_type"]:
        problems.append(f"content type {answer['content_type']} != {ref['content_type']}")
    if problems:
        return problems
    if mode == "chain":
        return diff(ref["body"], answer.get("body"), "$", True) + chain_diff(
            ref["body"], answer.get("body"))
    for part in ("body", "events", "text"):
        if part in ref:
            if part not in answer:
                return [f"{part} missing"]
            got = answer[part]
            if part == "events" and isinstance(got, list) and isinstance(ref[part], list):
                got = [_reference_keys(r, g) for r, g in zip(ref[part], got)] + got[len(ref[part]):]
            return diff(ref[part], got, "$", shape)
    return []


# keys mlxray adds to Responses stream events (OpenAI's, for the SDKs: the manifest's
# addition:behaviour:Responses stream event indices); compared only where the reference has them
RESPONSES_ADDITIONS = ("sequence_number", "output_index", "content_index")


def _reference_keys(ref: Any, got: Any) -> Any:
    if not (isinstance(ref, dict) and isinstance(got, dict)
            and str(got.get("type", "")).startswith("response.")):
        return got
    return {k: v for k, v in got.items() if k in ref or k not in RESPONSES_ADDITIONS}


def chain_diff(ref: Any, got: Any) -> list[str]:
    """The sampler chain's survivors at the first position: ids, pieces and probabilities."""
    def first(body: Any) -> Any:
        try:
            return body["completion_probabilities"][0]["top_probs"]
        except (KeyError, IndexError, TypeError):
            return None

    have = first(got)
    if have is None:
        return ["$.completion_probabilities[0].top_probs: missing"]
    return diff(first(ref), have, "$.completion_probabilities[0].top_probs")
