"""The native completion request schema: llama-server b10621's declarative field list.

One table (``FIELDS``) names every field the reference parses, in its declaration order, with its
type, aliases, default, soft limits (clamped) or hard limits (400), and what mlxray does with it.
Values convert as nlohmann::json's ``get<T>`` does (an int field truncates a float, accepts a
boolean, wraps an overflowing integer; a wrong type is a ``type_error.302``). ``null`` is absent,
unknown keys are ignored, and every error reads ``Field '<name as sent>': <detail>`` (spec §2.2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from engine.grammar_text import GrammarError, json_schema_grammar
from engine.types import (
    DEFAULT_SAMPLERS,
    RANDOM_SEED,
    TRIGGER_PATTERN,
    TRIGGER_PATTERN_FULL,
    TRIGGER_TOKEN,
    TRIGGER_WORD,
)

from .errors import invalid

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
FLT_MAX = float(np.finfo(np.float32).max)

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


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def type_error(expected: str, value: Any) -> ValueError:
    return ValueError(
        f"[json.exception.type_error.302] type must be {expected}, but is {json_type(value)}"
    )


def f32(value: float) -> float:
    """A float32 widened to double, as the reference echoes floats (0.8 -> 0.800000011920929)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _wrap(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def json_number(value: int | float) -> int | float:
    """The number as nlohmann::json holds it: an integer that fits neither int64 nor uint64 is
    a double (infinite past a double's range)."""
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return value


def to_int(value: Any, bits: int = 32, unsigned: bool = False) -> int:
    """An integer converts modulo the target's width; a double truncates, and one that does not
    fit the target (1e39 in an int32, -1.0 in the uint32 seed) is refused: the reference's C++
    conversion of it is undefined behaviour."""
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise type_error("number", value)
    value = json_number(value)
    if isinstance(value, float):
        lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        if not (math.isfinite(value) and lo <= math.trunc(value) <= hi):
            raise ValueError(f"{value!r} is out of the {'u' if unsigned else ''}int{bits} range")
        value = math.trunc(value)
    if unsigned:
        return value & ((1 << bits) - 1)
    return _wrap(value, bits)


def to_float(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise type_error("number", value)
    return f32(float(json_number(value)))


def to_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise type_error("boolean", value)
    return value


def to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise type_error("string", value)
    return value


def _fmt(value: float | int, is_float: bool) -> str:
    return f"{value:.6f}" if is_float else str(value)


# ---- the field table -------------------------------------------------------------------
# Policies (what mlxray does with a field):
#   honored    the effect is implemented
#   inert      the reference parses it and it changes nothing on this route; we do the same
#   refused    parsed and type-checked, then refused with a 400 naming it unless at its default
POLICIES = ("honored", "inert", "refused")


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # int32, int64, uint32, float, bool, str, custom
    attr: str = ""  # CompletionParams attribute; defaults to the name
    aliases: tuple[str, ...] = ()
    soft: tuple[float, float] | None = None
    hard: tuple[float, float] | None = None
    parent: str = ""  # nested under this object key
    policy: str = "honored"
    parse: Callable[[Any, Any], Any] | None = None  # custom: (value, context) -> value
    # custom, reading the whole object like the reference's handlers: (object, context) -> value
    handler: Callable[[dict, Any], Any] | None = None
    issue: int | None = None  # for refused fields: the issue that will honor them
    reason: str = ""  # for fields refused by design: why

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def target(self) -> str:
        return self.attr or self.name


@dataclass
class CompletionParams:
    """Effective values of one native request after defaults, clamps and validation."""

    verbose: bool = False
    timings_per_token: bool = False
    stream: bool = False
    include_usage: bool = False
    cache_prompt: bool = True
    return_tokens: bool = False
    return_progress: bool = False
    sse_ping_interval: int = 30
    n_predict: int = -1
    n_indent: int = 0
    n_keep: int = 0
    n_discard: int = 0
    n_cmpl: int = 1
    n_cache_reuse: int = 0
    t_max_predict_ms: int = -1
    response_fields: list[str] = field(default_factory=list)
    top_k: int = 40
    top_p: float = f32(0.95)
    min_p: float = f32(0.05)
    top_n_sigma: float = -1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = f32(0.1)
    typical_p: float = 1.0
    temperature: float = f32(0.8)
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    repeat_last_n: int = 64
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", '"', "*"])
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = f32(0.1)
    adaptive_target: float = -1.0
    adaptive_decay: float = f32(0.9)
    seed: int = RANDOM_SEED
    n_probs: int = 0
    min_keep: int = 0
    backend_sampling: bool = False
    post_sampling_probs: bool = False
    lora: list[dict] = field(default_factory=list)
    grammar: str = ""
    json_schema: Any = None
    grammar_lazy: bool = False
    grammar_triggers: list[dict] = field(default_factory=list)
    preserved_tokens: list[int] = field(default_factory=list)
    chat_format: int = 0
    chat_parser: Any = None
    continue_final_message: bool = False
    generation_prompt: str = ""
    parse_tool_calls: bool = False
    reasoning_format: str = "deepseek"
    reasoning_budget_tokens: int = -1
    reasoning_budget_start: list[int] = field(default_factory=list)  # the start tag's tokens
    reasoning_budget_end: list[list[int]] = field(default_factory=list)  # each end tag's tokens
    reasoning_budget_message: str = ""
    reasoning_budget_forced: list[int] = field(default_factory=list)  # message, first end tag
    reasoning_control: bool = False
    echo: bool = False
    logit_bias: list[tuple[int, float | None]] = field(default_factory=list)
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    # read outside the schema
    id_slot: int = -1
    # the LoRA adapters the request runs with, resolved from `lora` and `model` by the
    # ingress (deployments/adapters.py): (name, scale) pairs; the adapter `model` named, if
    # any; an on-demand adapter that routes it to a replica holding it (multiplexing)
    adapters: tuple[tuple[str, float], ...] = ()
    adapter_model: str = ""
    multiplex_id: str = ""
    # what the client sent, for the refusal check
    sent: set[str] = field(default_factory=set)


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


def _parse_response_fields(value: Any, ctx: ParseContext) -> list[str]:
    if not isinstance(value, list):
        return []  # lenient: json_value falls back to the default
    return [v for v in value if isinstance(v, str)]


def _parse_breakers(value: Any, ctx: ParseContext) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError("Error: dry_sequence_breakers must be a non-empty array of strings")
    return list(value)


def _parse_lora(value: Any, ctx: ParseContext) -> list[dict]:
    from .adapters import lora_list  # it builds on this module's conversions

    if not isinstance(value, list):
        raise ValueError("Error: 'lora' must be an array of objects with 'id' and 'scale' fields")
    return lora_list(value)


def _parse_stop(value: Any, ctx: ParseContext) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [to_str(v) for v in value]
    return []


def _parse_samplers(value: Any, ctx: ParseContext) -> list[str]:
    if isinstance(value, str):
        return [SAMPLER_CHARS[c] for c in value if c in SAMPLER_CHARS]
    if isinstance(value, list):
        names = [SAMPLER_NAMES.get(v) for v in value if isinstance(v, str)]
        return [n for n in names if n]
    return list(DEFAULT_SAMPLERS)


def _parse_logit_bias(value: Any, ctx: ParseContext) -> list[tuple[int, float | None]]:
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


def _parse_reasoning_format(value: Any, ctx: ParseContext) -> str:
    name = to_str(value)
    if name not in REASONING_FORMATS:
        raise ValueError(f"Unknown reasoning format: {name}")
    return name


def _parse_any(value: Any, ctx: ParseContext) -> Any:
    return value


def _tokens(text: str, ctx: ParseContext) -> list[int]:
    """common_tokenize(vocab, text, add_special=false, parse_special=true)."""
    if ctx.tokenize is None:
        raise RuntimeError("this field needs the tokenizer")
    return ctx.tokenize(text) if text else []


def _parse_start_tag(value: Any, ctx: ParseContext) -> list[int]:
    return _tokens(to_str(value), ctx)


def _json_items(value: Any) -> list:
    """What iterating a nlohmann::json value visits: an array's items, an object's values, none
    for null, any other value itself."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        return list(value.values())
    return [] if value is None else [value]


def _parse_end_tags(source: dict, ctx: ParseContext) -> list[list[int]]:
    """``reasoning_budget_end_tags`` wins whenever its key is there (a null one gives no tag);
    the alias is one string. Empty tags are dropped."""
    if "reasoning_budget_end_tags" in source:
        tags = [to_str(t) for t in _json_items(source["reasoning_budget_end_tags"])]
    else:
        tags = [to_str(source["reasoning_budget_end_tag"])]
    return [_tokens(tag, ctx) for tag in tags if tag]


def _parse_lenient_str(value: Any, ctx: ParseContext) -> str:
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
    ids = _tokens(text, ctx)
    return ids[0] if len(ids) == 1 else None


def _parse_preserved(value: Any, ctx: ParseContext) -> list[int]:
    """Strings that are one token each (others are dropped); the ids, ascending (a std::set)."""
    ids = {_single_token(to_str(item), ctx) for item in _json_items(value)}
    return sorted(i for i in ids if i is not None)


def _parse_grammar_triggers(value: Any, ctx: ParseContext) -> list[dict]:
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


def _parse_grammar(value: Any, ctx: ParseContext) -> str:
    return value if isinstance(value, str) else ""


FIELDS: tuple[Field, ...] = (
    Field("verbose", "bool", policy="inert"),
    Field("timings_per_token", "bool"),
    Field("stream", "bool"),
    Field("include_usage", "bool", parent="stream_options", policy="inert"),
    Field("cache_prompt", "bool"),
    Field("return_tokens", "bool"),
    Field("return_progress", "bool"),
    Field("sse_ping_interval", "int32", hard=(-1, INT32_MAX)),
    Field("n_predict", "int32", aliases=("max_completion_tokens", "max_tokens"),
          hard=(-1, INT32_MAX)),
    Field("n_indent", "int32", hard=(0, INT32_MAX)),
    Field("n_keep", "int32", hard=(-1, INT32_MAX), policy="inert"),
    Field("n_discard", "int32", hard=(0, INT32_MAX), policy="inert"),
    Field("n_cmpl", "int32", aliases=("n",)),  # hard limit [1, n_parallel] set at parse time
    Field("n_cache_reuse", "int32", hard=(0, INT32_MAX), policy="refused",
          reason="KV-shift chunk reuse is not available on MLX KV caches; the prefix cache "
                 "reuses the longest common prefix"),
    Field("t_max_predict_ms", "int64", hard=(-1, INT64_MAX)),
    Field("response_fields", "custom", parse=_parse_response_fields),
    Field("top_k", "int32", soft=(0, INT32_MAX)),
    Field("top_p", "float", soft=(0.0, 1.0)),
    Field("min_p", "float", soft=(0.0, 1.0)),
    Field("top_n_sigma", "float"),
    Field("xtc_probability", "float", soft=(0.0, 1.0)),
    Field("xtc_threshold", "float", soft=(0.0, 1.0)),
    Field("typical_p", "float"),
    Field("temperature", "float", soft=(0.0, math.inf)),
    Field("dynatemp_range", "float"),
    Field("dynatemp_exponent", "float"),
    Field("repeat_last_n", "int32", hard=(0, INT32_MAX)),
    Field("repeat_penalty", "float"),
    Field("frequency_penalty", "float"),
    Field("presence_penalty", "float"),
    Field("dry_multiplier", "float"),
    Field("dry_base", "float"),
    Field("dry_allowed_length", "int32", hard=(0, INT32_MAX)),
    Field("dry_penalty_last_n", "int32", hard=(0, INT32_MAX)),
    Field("mirostat", "int32", soft=(0, 2)),
    Field("mirostat_tau", "float"),
    Field("mirostat_eta", "float"),
    Field("adaptive_target", "float", soft=(-FLT_MAX, 1.0)),
    Field("adaptive_decay", "float", hard=(0.0, 0.99)),
    Field("seed", "uint32", soft=(0, UINT32_MAX)),
    Field("n_probs", "int32", aliases=("logprobs",)),
    Field("min_keep", "int32", hard=(0, INT32_MAX)),
    Field("backend_sampling", "bool", policy="inert"),
    Field("post_sampling_probs", "bool"),
    Field("lora", "custom", parse=_parse_lora),  # resolved by deployments/adapters.py
    Field("dry_sequence_breakers", "custom", parse=_parse_breakers),
    Field("json_schema", "custom", aliases=("grammar",), parse=_parse_any),
    Field("grammar_lazy", "bool"),
    Field("chat_format", "int32", policy="inert"),
    Field("reasoning_format", "custom", parse=_parse_reasoning_format, policy="inert"),
    Field("generation_prompt", "str"),  # echoed; the reasoning budget's prefill
    Field("parse_tool_calls", "bool", policy="inert"),
    Field("chat_parser", "custom", parse=_parse_any, policy="inert"),
    Field("continue_final_message", "bool", policy="inert"),
    Field("echo", "bool", policy="inert"),
    # preserved_tokens first: a trigger word that is one token must be one of them
    Field("preserved_tokens", "custom", parse=_parse_preserved),
    Field("grammar_triggers", "custom", parse=_parse_grammar_triggers),
    # a boolean: it arms the budget sampler for POST /v1/chat/completions/control (501 here)
    Field("reasoning_control", "bool", policy="inert"),
    # the reasoning budget (engine/reasoning_budget.py): tags tokenized with special tokens
    Field("reasoning_budget_tokens", "int32", hard=(-1, INT32_MAX)),
    Field("reasoning_budget_start_tag", "custom", attr="reasoning_budget_start",
          parse=_parse_start_tag),
    Field("reasoning_budget_end_tags", "custom", aliases=("reasoning_budget_end_tag",),
          attr="reasoning_budget_end", handler=_parse_end_tags),
    Field("reasoning_budget_message", "custom", parse=_parse_lenient_str),
    Field("logit_bias", "custom", parse=_parse_logit_bias),
    Field("ignore_eos", "bool"),
    Field("stop", "custom", parse=_parse_stop),
    Field("samplers", "custom", parse=_parse_samplers),
)

# The speculative.* keys are in the reference's inventory but disabled in its schema (#if 0):
# sent or not, nothing reads them, so they stay out of the table and are ignored as unknown keys.
SPECULATIVE_KEYS = ("speculative.n_max", "speculative.n_min", "speculative.p_min",
                    "speculative.type", "speculative.ngram_size_n", "speculative.ngram_size_m",
                    "speculative.ngram_min_hits")

_FIELD_DEFAULTS = {f.name: f.default for f in fields(CompletionParams)
                   if not callable(f.default_factory)}


def _convert(spec: Field, value: Any, ctx: ParseContext) -> Any:
    kind = spec.kind
    if kind == "custom":
        return spec.parse(value, ctx)
    if kind == "bool":
        return to_bool(value)
    if kind == "str":
        return to_str(value)
    if kind == "float":
        result: float | int = to_float(value)
    elif kind == "int64":
        result = to_int(value, 64)
    elif kind == "uint32":
        result = to_int(value, 32, unsigned=True)
    else:
        result = to_int(value, 32)
    hard = spec.hard
    if spec.name == "n_cmpl":
        hard = (1, ctx.n_parallel)
    if hard is not None and not hard[0] <= result <= hard[1]:
        is_float = kind == "float"
        raise ValueError(
            f"Value must be between {_fmt(hard[0], is_float)} <= value <= "
            f"{_fmt(hard[1], is_float)}, but got {_fmt(result, is_float)}"
        )
    if spec.soft is not None:
        lo, hi = spec.soft
        result = min(max(result, lo), hi)
        if kind == "float":
            result = f32(result)
    return result


def parse_completion(body: dict, ctx: ParseContext, defaults: CompletionParams) -> CompletionParams:
    """Evaluate ``body`` against FIELDS in declaration order, starting from the server defaults."""
    params = CompletionParams(**{f.name: _copy(getattr(defaults, f.name))
                                 for f in fields(CompletionParams)})
    params.sent = set()
    ctx = replace(ctx, request=params)
    for spec in FIELDS:
        source = body
        if spec.parent:
            source = body.get(spec.parent)
            if not isinstance(source, dict):
                continue
        key = next((k for k in spec.keys if source.get(k) is not None), None)
        if key is None:
            continue
        try:
            value = spec.handler(source, ctx) if spec.handler else _convert(spec, source[key], ctx)
        except ValueError as exc:
            raise invalid(f"Field '{key}': {exc}") from None
        setattr(params, spec.target, value)
        params.sent.add(spec.name)
    _post_process(params, body, ctx, defaults)
    return params


def _post_process(params: CompletionParams, body: dict, ctx: ParseContext,
                  defaults: CompletionParams) -> None:
    # dry_base below 1 falls back to the server default
    if params.dry_base < 1.0:
        params.dry_base = defaults.dry_base
    _resolve_grammar(params, body)
    if params.ignore_eos:
        params.logit_bias = params.logit_bias + [(t, None) for t in ctx.eog_ids]
    if "reasoning_budget_message" in params.sent and params.reasoning_budget_end:
        # only a sent message sets what is forced: the message, then the first end tag
        params.reasoning_budget_forced = (_tokens(params.reasoning_budget_message, ctx)
                                          + params.reasoning_budget_end[0])
    if not params.stop:
        params.stop = list(defaults.stop)
    id_slot = body.get("id_slot", -1)
    params.id_slot = id_slot if isinstance(id_slot, int) and not isinstance(id_slot, bool) else -1
    _refuse_unsupported(params, defaults)


def _resolve_grammar(params: CompletionParams, body: dict) -> None:
    """``grammar`` (GBNF, or Lark after ``%llguidance``) wins when both are sent; a
    ``json_schema`` alone is converted, and the grammar it becomes is what gets echoed."""
    schema = params.json_schema
    params.json_schema = None
    if isinstance(body.get("grammar"), str):
        params.grammar = body["grammar"]
    elif body.get("grammar") is None and schema is not None:
        try:
            params.grammar = json_schema_grammar(schema)
        except GrammarError as exc:
            raise invalid(f"Field 'json_schema': \"json_schema\": JSON schema conversion "
                          f"failed:\n{exc}") from None
        params.json_schema = schema


def is_default(spec: Field, params: CompletionParams, defaults: CompletionParams) -> bool:
    value = getattr(params, spec.target)
    return value == getattr(defaults, spec.target) or value in (None, "", [], False)


def _refuse_unsupported(params: CompletionParams, defaults: CompletionParams) -> None:
    """A field mlxray does not honor yet is refused, naming it, unless it asks for the default."""
    for spec in FIELDS:
        if spec.policy != "refused" or spec.name not in params.sent:
            continue
        active = not is_default(spec, params, defaults)
        if active and spec.reason:
            raise invalid(f"Field '{spec.name}': not supported by mlxray ({spec.reason})")
        if active:
            raise invalid(f"Field '{spec.name}': not supported by mlxray yet (issue #{spec.issue})")


def _copy(value: Any) -> Any:
    if isinstance(value, (list, set, dict)):
        return type(value)(value)
    return value


# ---- prompts (spec §2.1) -----------------------------------------------------------------
def split_prompts(body: dict) -> list:
    """The sub-prompts of a request: an array without integers is several prompts."""
    if "prompt" not in body:
        raise invalid("[json.exception.out_of_range.403] key 'prompt' not found")
    prompt = body["prompt"]
    if isinstance(prompt, list) and not any(
        isinstance(p, int) and not isinstance(p, bool) for p in prompt
    ):
        prompts = list(prompt)
    else:
        prompts = [prompt]
    if not prompts:
        raise invalid('"prompt" must not be empty')
    return prompts


def field_names() -> list[str]:
    return [f.name for f in FIELDS]
