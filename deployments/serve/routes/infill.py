"""POST /infill: fill-in-the-middle (deployments/api/infill.py builds the prompt), then the
/completion path with that token prompt: the same fields, n_indent, streaming and response."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from deployments.api.infill import InfillBudget, check_fim_tokens, check_infill_body, infill_prompt
from deployments.serve.app import off_loop, read_json
from deployments.serve.endpoint import IngressBase, ModelEndpoint
from deployments.serve.routes.native import answer, prepare


def completion_body(model: ModelEndpoint, body: Any) -> dict:
    """The /completion body an /infill body stands for: its fields, the assembled prompt."""
    check_fim_tokens(model.vocab.fim_ids)
    extra = check_infill_body(body)
    args = model.args
    budget = InfillBudget(args.batch_size, args.n_predict, args.n_ctx, args.spm_infill)
    return {**body, "prompt": infill_prompt(model.vocab, body, extra, budget)}


async def infill(ingress: IngressBase, request: Request) -> Response:
    await ingress.guard(request)
    body = await read_json(request, ingress.args.max_body_bytes)
    model = await ingress.model_of(body, request)
    completion = await off_loop(completion_body, model, body)
    params, prompts = await off_loop(prepare, model, completion)
    return await answer(model, params, prompts, request)
