"""The server's defaults of a request's fields: one CompletionParams per model, built from the
graph's settings (``--temp``, ``--seed``, ``-n`` and the ``sampling`` object the sampling options
fill) by the request's own parser, so a default is the very value the same field sent in a
request would be, and what a request sends overrides it (llama-server's ``params_base``).
/props ``default_generation_settings`` and every ``generation_settings`` start from it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deployments.api.errors import ApiError
from deployments.api.schema import CompletionParams, ParseContext, parse_completion
from engine.sampler_fields import SAMPLER_FIELDS

# the request fields the command's sampling options (deployments/cli/sampling.py) may default:
# the sampler table's rows that have an option, and the list-valued ones
SAMPLING_KEYS = (*(f.name for f in SAMPLER_FIELDS if f.flags), "dry_sequence_breakers",
                 "samplers", "ignore_eos")


def server_defaults(sampling: dict[str, Any], temperature: float, seed: int, n_predict: int,
                    **fixed: Any) -> CompletionParams:
    """The defaults: ``fixed`` fields as given, the rest parsed as a request's body would be.
    An empty ``dry_sequence_breakers`` (``--dry-sequence-breaker none``) is a server default
    only: a request may not send one."""
    body = {"temperature": temperature, "seed": seed, "n_predict": n_predict, **sampling}
    breakers = body.pop("dry_sequence_breakers", None)
    try:
        params = parse_completion(body, ParseContext(), CompletionParams(**fixed))
    except ApiError as exc:
        raise ValueError(f"sampling: {exc.message}") from None
    params = replace(params, sent=set())
    if breakers is not None:
        params.dry_sequence_breakers = list(breakers)
    return params


def check_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """GraphArgs ``sampling``: known keys, each value one a request could send."""
    unknown = sorted(set(sampling) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(f"sampling: unknown keys {', '.join(unknown)} (known: "
                         f"{', '.join(SAMPLING_KEYS)})")
    breakers = sampling.get("dry_sequence_breakers", [])
    if not isinstance(breakers, list) or not all(isinstance(b, str) for b in breakers):
        raise ValueError("sampling: dry_sequence_breakers must be a list of strings")
    server_defaults(sampling, 0.8, 0, -1)
    return sampling
