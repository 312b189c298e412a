"""The native request's custom fields (``Field.parse`` / ``Field.handler`` of
deployments/api/schema.py): stop strings, samplers, logit bias, DRY breakers, grammar triggers,
reasoning tags, LoRA lists, each read as llama-server's handler reads it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployments.api.json_values import json_type, to_float, to_int, to_str
from engine.types import (
    DEFAULT_SAMPLERS,
    TRIGGER_PATTERN,
    TRIGGER_PATTERN_FULL,
    TRIGGER_TOKEN,
    TRIGGER_WORD,
)

if TYPE_CHECKING:
    from deployments.api.schema import CompletionParams

SAMPLER_NAMES = {
    "dry": "dry", "top_k": "top_k", "top_p": "top_p", "top_n_sigma": "top_n_sigma",
    "typ_p": "typ_p", "min_p": "min_p", "temperature": "temperature", "xtc": "xtc",
    "infill": "infill", "penalties": "penalties", "adaptive_p": "adaptive_p",
    # aliases (common/sampling.cpp)
    "top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p",
    "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p",
    "min-p": "min_p", "temp": "temperature", "adaptive-p": "adaptive_p",
    "topk": "top_k", "topp": "top_p", "topnsigma": "top_n_sigma", "typicalp": "typ_p",
    "typp": "typ_p", "minp": "min_p", "adaptivep": "adaptive_p",
}
SAMPLER_CHARS = {
    "d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
    "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p",
}
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass
class ParseContext:
    """What field parsers need from the server: slot count, tokenizer (special tokens parsed);
    and, while one request is parsed, that request as far as it got (a field may depend on an
    earlier one)."""

    n_parallel: int = 4
    tokenize: Callable[[str], list[int]] | None = None
    n_vocab: int = 0
    eog_ids: tuple[int, ...] = ()
    request: CompletionParams | None = None


def parse_response_fields(value: Any, ctx: ParseContext) -> list[str]:
    if not isinstance(value, list):
        return []  # lenient: json_value falls back to the default
    return [v for v in value if isinstance(v, str)]


def parse_breakers(value: Any, ctx: ParseContext) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError("Error: dry_sequence_breakers must be a non-empty array of strings")
    return list(value)


def parse_lora(value: Any, ctx: ParseContext) -> list[dict]:
    if not isinstance(value, list):
        raise ValueError("Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
    return lora_list(value)


def lora_list(entries: list) -> list[dict]:
    """parse_lora_request: each entry's id (-1 when missing or not a number) and scale (0.0),
    the last one per id winning, ordered by id."""
    scales: dict[int, float] = {}
    for entry in entries:
        scales[_entry_value(entry, "id", -1, to_int)] = _entry_value(entry, "scale", 0.0,
                                                                     to_float)
    return [{"id": i, "scale": scales[i]} for i in sorted(scales)]


def _entry_value(entry: Any, key: str, default: Any, convert: Callable[[Any], Any]) -> Any:
    """json_value(entry, key, default): the default for a missing, null or mistyped value."""
    if not isinstance(entry, dict) or entry.get(key) is None:
        return default
    try:
        return convert(entry[key])
    except ValueError:
        return default


def parse_stop(value: Any, ctx: ParseContext) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [to_str(v) for v in value]
    return []


def parse_samplers(value: Any, ctx: ParseContext) -> list[str]:
    if isinstance(value, str):
        return [SAMPLER_CHARS[c] for c in value if c in SAMPLER_CHARS]
    if isinstance(value, list):
        names = [SAMPLER_NAMES.get(v) for v in value if isinstance(v, str)]
        return [n for n in names if n]
    return list(DEFAULT_SAMPLERS)


def parse_logit_bias(value: Any, ctx: ParseContext) -> list[tuple[int, float | None]]:
    """Three forms: [[tok, bias], ...], [[str, bias], ...] and {"tok or str": bias}; a bias of
    false bans the token; malformed entries are skipped."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(value, list):
        pairs = [(e[0], e[1]) for e in value if isinstance(e, list) and len(e) == 2]
    elif isinstance(value, dict):
        pairs = list(value.items())
    out: list[tuple[int, float | None]] = []
    for key, bias in pairs:
        if bias is False:
            b: float | None = None
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            b = to_float(bias)
        else:
            continue
        ids: list[int] = []
        if isinstance(key, int) and not isinstance(key, bool):
            ids = [key] if 0 <= key < ctx.n_vocab else []
        elif isinstance(key, str):
            as_int = _strtol(key)
            if as_int is not None:
                ids = [as_int] if 0 <= as_int < ctx.n_vocab else []
            elif ctx.tokenize is not None:
                ids = ctx.tokenize(key)
        out += [(t, b) for t in ids]
    return out


def _strtol(text: str) -> int | None:
    try:
        return int(text.strip(), 10)
    except ValueError:
        return None


def parse_reasoning_format(value: Any, ctx: ParseContext) -> str:
    name = to_str(value)
    if name not in REASONING_FORMATS:
        raise ValueError(f"Unknown reasoning format: {name}")
    return name


def parse_any(value: Any, ctx: ParseContext) -> Any:
    return value


def tokens_of(text: str, ctx: ParseContext) -> list[int]:
    """common_tokenize(vocab, text, add_special=false, parse_special=true)."""
    if ctx.tokenize is None:
        raise RuntimeError("this field needs the tokenizer")
    return ctx.tokenize(text) if text else []


def parse_start_tag(value: Any, ctx: ParseContext) -> list[int]:
    return tokens_of(to_str(value), ctx)


def _json_items(value: Any) -> list:
    """What iterating a nlohmann::json value visits: an array's items, an object's values, none
    for null, any other value itself."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return [] if value is None else [value]


def parse_end_tags(source: dict, ctx: ParseContext) -> list[list[int]]:
    """``reasoning_budget_end_tags`` wins whenever its key is there (a null one gives no tag);
    the alias is one string. Empty tags are dropped."""
    if "reasoning_budget_end_tags" in source:
        tags = [to_str(t) for t in _json_items(source["reasoning_budget_end_tags"])]
    else:
        tags = [to_str(source["reasoning_budget_end_tag"])]
    return [tokens_of(tag, ctx) for tag in tags if tag]


def parse_lenient_str(value: Any, ctx: ParseContext) -> str:
    """json_value(data, key, std::string()): a value of another type reads as the default."""
    return value if isinstance(value, str) else ""


def _json_at(value: Any, key: str) -> Any:
    """nlohmann's ``at(key)``."""
    if not isinstance(value, dict):
        raise ValueError(f"[json.exception.type_error.304] cannot use at() with {json_type(value)}")
    if key not in value:
        raise ValueError(f"[json.exception.out_of_range.403] key '{key}' not found")
    return value[key]


def _single_token(text: str, ctx: ParseContext) -> int | None:
    """The id ``text`` tokenizes to (special tokens parsed), when it is exactly one token."""
    ids = tokens_of(text, ctx)
    return ids[0] if len(ids) == 1 else None


def parse_preserved(value: Any, ctx: ParseContext) -> list[int]:
    """Strings that are one token each (others are dropped); the ids, ascending (a std::set)."""
    ids = {_single_token(to_str(item), ctx) for item in _json_items(value)}
    return sorted(i for i in ids if i is not None)


def parse_grammar_triggers(value: Any, ctx: ParseContext) -> list[dict]:
    """``{"type", "value"[, "token"]}`` objects, as echoed. A word that is one token becomes a
    token trigger and must then be a preserved token; a lazy grammar needs one trigger at least."""
    preserved = ctx.request.preserved_tokens if ctx.request is not None else []
    triggers = []
    for item in _json_items(value):
        kind = to_int(_json_at(item, "type"))
        text = to_str(_json_at(item, "value"))
        if kind == TRIGGER_TOKEN:
            triggers.append({"type": kind, "value": text, "token": to_int(_json_at(item, "token"))})
        elif kind == TRIGGER_WORD and (token := _single_token(text, ctx)) is not None:
            if token not in preserved:
                raise ValueError(
                    f"Grammar trigger word should be marked as preserved token: {text}")
            triggers.append({"type": TRIGGER_TOKEN, "value": text, "token": token})
        elif kind in (TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL):
            triggers.append({"type": kind, "value": text})
        else:  # the reference asserts (aborts) on it when it builds the sampler
            raise ValueError("Unknown grammar trigger type")
    if ctx.request is not None and ctx.request.grammar_lazy and not triggers:
        raise ValueError("Error: no triggers set for lazy grammar!")
    return triggers
