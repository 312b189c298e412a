"""CompletionParams converted to the engine's own requests (engine/types.py), once, beside the
request type (as vLLM's protocol modules convert theirs): one GenerationRequest per prompt and
completion. The response shaper converts a request as it hands it to the model replica, so what
crosses that hop is the engine's type; the ingress -> shaper hop carries the CompletionParams,
which the shaper needs to shape the answer (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import fields

from deployments.api.schema import CompletionParams
from engine.types import (
    RANDOM_SEED,
    UNLIMITED_BUDGET,
    GenerationRequest,
    GrammarTrigger,
    ReasoningBudget,
    SamplingParams,
)


def to_requests(params: CompletionParams, prompts: list[list[int]],
                completion_id: str = "") -> list[GenerationRequest]:
    """One engine request per prompt and completion, indexed prompt-major (index = p*n + j);
    children of n_cmpl get seed + j unless the seed is random. ``completion_id`` is the OpenAI
    answer's id, which the control route names."""
    out = []
    n = params.n_cmpl
    for p, tokens in enumerate(prompts):
        for j in range(n):
            seed = params.seed if params.seed == RANDOM_SEED else (params.seed + j) & 0xFFFFFFFF
            out.append(GenerationRequest(
                prompt_tokens=tokens,
                sampling=_sampling(params, seed),
                n_predict=params.n_predict,
                stop=list(params.stop),
                grammar=params.grammar,
                grammar_prefill=_grammar_prefill(params),
                reasoning_budget=_reasoning_budget(params),
                grammar_lazy=params.grammar_lazy,
                grammar_triggers=[GrammarTrigger(t["type"], t["value"], t.get("token", -1))
                                  for t in params.grammar_triggers],
                preserved_tokens=list(params.preserved_tokens),
                ignore_eos=params.ignore_eos,
                cache_prompt=params.cache_prompt,
                n_indent=params.n_indent,
                t_max_predict_ms=params.t_max_predict_ms,
                stream=params.stream,
                return_progress=params.return_progress,
                timings_per_token=params.timings_per_token,
                id_slot=params.id_slot if j == 0 else -1,
                index=p * n + j,
                child=j > 0,
                adapters=params.adapters,
                completion_id=completion_id,
                reasoning_control=params.reasoning_control,
                tag=params,
            ))
    return out


def _sampling(p: CompletionParams, seed: int) -> SamplingParams:
    """The schema's sampling values, field by field (every SamplingParams field is a schema field
    of the same name), with the seed of this completion."""
    values = {f.name: _copy(getattr(p, f.name)) for f in fields(SamplingParams)}
    return SamplingParams(**{**values, "seed": seed})


def _reasoning_budget(p: CompletionParams) -> ReasoningBudget | None:
    """common_sampler_init makes the budget sampler only with a start tag, an end tag and a budget
    (or reasoning_control or grammar_lazy, with an unlimited budget that never forces: it holds a
    lazy grammar off inside the tags)."""
    if not p.reasoning_budget_start or not p.reasoning_budget_end:
        return None
    if p.reasoning_budget_tokens < 0 and not (p.grammar_lazy or p.reasoning_control):
        return None
    tokens = p.reasoning_budget_tokens if p.reasoning_budget_tokens >= 0 else UNLIMITED_BUDGET
    return ReasoningBudget(tokens, list(p.reasoning_budget_start),
                           [list(tag) for tag in p.reasoning_budget_end],
                           list(p.reasoning_budget_forced), p.generation_prompt)


def _grammar_prefill(p: CompletionParams) -> str:
    """A json_schema's grammar (an output-format grammar) accepts the generation prompt first,
    unless lazy (common_grammar_needs_prefill); a client's grammar string never does."""
    return p.generation_prompt if p.json_schema is not None and not p.grammar_lazy else ""


def _copy(value):
    return list(value) if isinstance(value, list) else value
