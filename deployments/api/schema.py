"""The native completion request schema: llama-server b10621's declarative field list.

One table (``FIELDS``) names every field the reference parses, in its declaration order, with its
type, aliases, default, soft limits (clamped) or hard limits (400), and what mlxray does with it.
Values convert as nlohmann::json's ``get<T>`` does (an int field truncates a float, accepts a
boolean, wraps an overflowing integer; a wrong type is a ``type_error.302``). ``null`` is absent,
unknown keys are ignored, and every error reads ``Field '<name as sent>': <detail>`` (spec §2.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from deployments.api.errors import invalid
from deployments.api.field_parsers import (
    ParseContext,
    parse_any,
    parse_breakers,
    parse_end_tags,
    parse_grammar_triggers,
    parse_lenient_str,
    parse_logit_bias,
    parse_lora,
    parse_preserved,
    parse_reasoning_format,
    parse_response_fields,
    parse_samplers,
    parse_start_tag,
    parse_stop,
    tokens_of,
)
from deployments.api.json_values import (
    INT32_MAX,
    INT64_MAX,
    UINT32_MAX,
    _fmt,
    f32,
    to_bool,
    to_float,
    to_int,
    to_str,
)
from engine.grammar_text import GrammarError, json_schema_grammar
from engine.sampler_fields import SAMPLER_FIELDS, sampler_dataclass
from engine.types import (
    DEFAULT_SAMPLERS,
    RANDOM_SEED,
)

# ---- the field table -------------------------------------------------------------------
# Policies (what mlxray does with a field):
#   honored    the effect is implemented
#   inert      the reference parses it and it changes nothing on this route; we do the same
#   refused    parsed and type-checked, then refused with a 400 naming it unless at its default


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


# the numeric sampler settings, one row each (engine/sampler_fields.py), floats as float32
CompletionSamplers = sampler_dataclass(
    "CompletionSamplers", lambda f: f32(f.default) if f.kind == "float" else f.default,
    slots=False)
CompletionSamplers.__module__ = __name__


@dataclass
class CompletionParams(CompletionSamplers):
    """Effective values of one native request after defaults, clamps and validation: the
    sampler table's settings (CompletionSamplers), and these."""

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
    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", '"', "*"])
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
    speculative_types: str = "none"  # the server's --spec-type, echoed (not a request field)
    echo: bool = False
    logit_bias: list[tuple[int, float | None]] = field(default_factory=list)
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    # read outside the schema
    id_slot: int = -1
    # the LoRA adapters the request runs with, resolved from `lora` and `model` by the
    # ingress (deployments/api/adapters.py): (name, scale) pairs; the adapter `model` named, if
    # any; an on-demand adapter that routes it to a replica holding it (multiplexing)
    adapters: tuple[tuple[str, float], ...] = ()
    adapter_model: str = ""
    multiplex_id: str = ""
    # what the client sent, for the refusal check
    sent: set[str] = field(default_factory=set)


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
    Field("n_cache_reuse", "int32", hard=(0, INT32_MAX), policy="refused", issue=36),
    Field("t_max_predict_ms", "int64", hard=(-1, INT64_MAX)),
    Field("response_fields", "custom", parse=parse_response_fields),
    # the sampler table's rows, in their schema order (engine/sampler_fields.py)
    *(Field(f.name, f.kind, soft=f.soft, hard=f.hard) for f in SAMPLER_FIELDS),
    Field("seed", "uint32", soft=(0, UINT32_MAX)),
    Field("n_probs", "int32", aliases=("logprobs",)),
    Field("min_keep", "int32", hard=(0, INT32_MAX)),
    Field("backend_sampling", "bool", policy="inert"),
    Field("post_sampling_probs", "bool"),
    Field("lora", "custom", parse=parse_lora),  # resolved by deployments/api/adapters.py
    Field("dry_sequence_breakers", "custom", parse=parse_breakers),
    Field("json_schema", "custom", aliases=("grammar",), parse=parse_any),
    Field("grammar_lazy", "bool"),
    Field("chat_format", "int32", policy="inert"),
    Field("reasoning_format", "custom", parse=parse_reasoning_format, policy="inert"),
    Field("generation_prompt", "str"),  # echoed; the reasoning budget's prefill
    Field("parse_tool_calls", "bool", policy="inert"),
    Field("chat_parser", "custom", parse=parse_any, policy="inert"),
    Field("continue_final_message", "bool", policy="inert"),
    Field("echo", "bool", policy="inert"),
    # preserved_tokens first: a trigger word that is one token must be one of them
    Field("preserved_tokens", "custom", parse=parse_preserved),
    Field("grammar_triggers", "custom", parse=parse_grammar_triggers),
    # a boolean: it arms the budget sampler for POST /v1/chat/completions/control (501 here)
    Field("reasoning_control", "bool"),
    # the reasoning budget (engine/reasoning_budget.py): tags tokenized with special tokens
    Field("reasoning_budget_tokens", "int32", hard=(-1, INT32_MAX)),
    Field("reasoning_budget_start_tag", "custom", attr="reasoning_budget_start",
          parse=parse_start_tag),
    Field("reasoning_budget_end_tags", "custom", aliases=("reasoning_budget_end_tag",),
          attr="reasoning_budget_end", handler=parse_end_tags),
    Field("reasoning_budget_message", "custom", parse=parse_lenient_str),
    Field("logit_bias", "custom", parse=parse_logit_bias),
    Field("ignore_eos", "bool"),
    Field("stop", "custom", parse=parse_stop),
    Field("samplers", "custom", parse=parse_samplers),
)

# The speculative.* keys are in the reference's inventory but disabled in its schema (#if 0):
# sent or not, nothing reads them, so they stay out of the table and are ignored as unknown keys.
SPECULATIVE_KEYS = ("speculative.n_max", "speculative.n_min", "speculative.p_min",
                    "speculative.type", "speculative.ngram_size_n", "speculative.ngram_size_m",
                    "speculative.ngram_min_hits")

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
        params.reasoning_budget_forced = (tokens_of(params.reasoning_budget_message, ctx)
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
