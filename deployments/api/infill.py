"""POST /infill as data: the reference's field checks and its fill-in-the-middle prompt
(tools/server/server-common.cpp format_prompt_infill, server-context.cpp post_infill).

The assembled prompt is a token array that the /completion path then serves as it serves any
prompt: sampling fields, n_indent, streaming and the response's shape are the completion's.
``vocab`` is the engine's Vocab (engine/vocab.py): tokenize, tokenize_mixed, fim_ids, add_bos,
bos_id; nothing here imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.api.errors import ApiError, invalid
from deployments.api.json_values import json_type

EXTRA_NOT_ARRAY = '"input_extra" must be an array of {"filename": string, "text": string}'
CHUNK_TEXT = 'extra_context chunk must contain a "text" field with a string value'
CHUNK_FILENAME = 'extra_context chunk\'s "filename" field must be a string'
# the separator of extra chunks in a vocabulary without <|file_sep|>
CHUNK_PREFIX = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True)
class InfillBudget:
    """The server settings the prompt's budgets read: -b, -n, the slot's context, --spm-infill."""

    n_batch: int
    n_predict: int
    n_ctx: int
    spm_infill: bool = False


def check_fim_tokens(fim_ids: dict[str, int]) -> None:
    """The reference's 501 for a model without the prefix, suffix or middle token."""
    missing = "".join(f"{name} token is missing. " for role, name in
                      (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
                      if role not in fim_ids)
    if missing:
        raise ApiError(f"Infill is not supported by this model: {missing}", "not_supported_error")


def check_infill_body(body: Any) -> list[dict]:
    """The reference's checks of an /infill body; its input_extra chunks (``[]`` when absent)."""
    if not isinstance(body, dict):
        raise invalid(f"[json.exception.type_error.304] cannot use at() with {json_type(body)}")
    extra = body.get("input_extra", [])
    if not isinstance(extra, list):
        raise invalid(EXTRA_NOT_ARRAY)
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid(CHUNK_TEXT)
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise invalid(CHUNK_FILENAME)
    for key in ("input_prefix", "input_suffix"):
        if key not in body:
            raise invalid(f"[json.exception.out_of_range.403] key '{key}' not found")
    return extra


def _literal(vocab: Any, text: str) -> list[int]:
    return vocab.tokenize(text, add_special=False, parse_special=False)


def _mixed(vocab: Any, value: Any) -> list[int]:
    """llama.cpp's tokenize_mixed(vocab, value, false, false): a string or a mixed array."""
    if isinstance(value, str):
        return _literal(vocab, value)
    if isinstance(value, list):
        return vocab.tokenize_mixed(value, add_special=False, parse_special=False)
    raise invalid(f"[json.exception.type_error.302] type must be string, but is "
                  f"{json_type(value)}")


def extra_tokens(vocab: Any, extra: list[dict]) -> list[int]:
    """The repo-level context: [FIM_REP]myproject, a [FIM_SEP]filename and text per chunk, and
    the current file's [FIM_SEP]filename."""
    rep, sep = vocab.fim_ids.get("rep"), vocab.fim_ids.get("sep")
    out: list[int] = [] if rep is None else [rep, *_literal(vocab, "myproject\n")]
    for chunk in extra:
        if sep is not None:
            out += [sep, *_literal(vocab, chunk.get("filename", "tmp") + "\n")]
        else:
            out += _literal(vocab, CHUNK_PREFIX)
        out += _literal(vocab, chunk["text"])
    if sep is not None:
        out += [sep, *_literal(vocab, "filename\n")]
    return out


def infill_prompt(vocab: Any, body: dict, extra: list[dict], budget: InfillBudget) -> list[int]:
    """format_prompt_infill: [extra][BOS][PRE]prefix prompt[SUF]suffix[MID] (PSM), or with
    --spm-infill [extra][BOS][SUF]suffix[PRE]prefix prompt[MID]; the prefix keeps its last
    3/4 of n_batch, the suffix its first n_batch/4 less the prompt, the extra context its last
    n_ctx - n_batch - 2 n_predict tokens."""
    prefix = _mixed(vocab, body["input_prefix"])
    suffix = _mixed(vocab, body["input_suffix"])
    prompt = body.get("prompt", "")
    prompt_tokens = vocab.tokenize(prompt if isinstance(prompt, str) else "", add_special=False)
    context = extra_tokens(vocab, extra)
    n_prefix = min(len(prefix), 3 * (budget.n_batch // 4))
    n_suffix = min(len(suffix), max(0, budget.n_batch // 4 - (2 + len(prompt_tokens))))
    n_extra = min(max(0, budget.n_ctx - budget.n_batch - 2 * budget.n_predict), len(context))
    fim = vocab.fim_ids
    head = [fim["pre"], *prefix[len(prefix) - n_prefix:], *prompt_tokens]
    tail = [fim["suf"], *suffix[:n_suffix]]
    first, second = (tail, head) if budget.spm_infill else (head, tail)
    bos = [vocab.bos_id] if vocab.add_bos else []
    return [*context[len(context) - n_extra:], *bos, *first, *second, fim["mid"]]
