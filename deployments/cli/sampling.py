"""llama-server's sampling options (``--top-k``, ``--top-p``, ``--dry-*``, ``--samplers``, ...):
server-wide defaults of a request's sampling fields, as the reference's ``params_base.sampling``.

Each lands in GraphArgs ``sampling`` under the request field it defaults (``--typical`` is
``typical_p``, ``--mirostat-lr`` is ``mirostat_eta``); the ingress reads that one object through
the request's own parser (deployments/serve/endpoint.py ``server_defaults``), so a default and the
same
value sent in a request are the same number, and a request's own field overrides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.sampler_fields import SAMPLER_FIELDS

# option dest -> the request field it is the default of: the sampler table's rows
# (engine/sampler_fields.py) that have an option, and the list-valued ones
FIELDS = {**{f.option_dest: f.name for f in SAMPLER_FIELDS if f.flags},
          "dry_sequence_breaker": "dry_sequence_breakers", "ignore_eos": "ignore_eos"}
SAMPLER_FLAGS = ("--samplers", "--sampler-seq", "--sampling-seq")


def _breaker(value: str) -> list[str]:
    """One --dry-sequence-breaker: a list of one, so repeats extend it (action="extend")."""
    return [value]


def options(option: type) -> tuple:
    """The sampling options, as ``option`` (the command's Option class) describes them."""
    o = option
    kinds = {"int32": int, "float": float}
    return (
        *(o(f.flags, f.option_dest, f.env, kinds[f.kind], f.option_help, check=f.option_check())
          for f in SAMPLER_FIELDS if f.flags),
        o(("--dry-sequence-breaker",), "dry_sequence_breaker", None, _breaker,
          "a default DRY sequence breaker (repeatable; the first clears the defaults "
          "'\\n', ':', '\"', '*'; none: no breakers)", repeat=True),
        o(("--samplers",), "samplers", None, str,
          "default sampler chain, names separated by ';' (penalties;dry;top_n_sigma;top_k;"
          "typ_p;top_p;min_p;xtc;temperature)"),
        o(("--sampler-seq", "--sampling-seq"), "sampler_seq", None, str,
          "default sampler chain, one letter each (edskypmxt)"),
        o(("--ignore-eos",), "ignore_eos", None, None,
          "default ignore_eos: generate past the end-of-generation tokens"),
    )


def breakers(given: list[str]) -> list[str]:
    """--dry-sequence-breaker's values as the reference folds them: ``none`` clears the list."""
    out: list[str] = []
    for value in given:
        out = [] if value == "none" else [*out, value]
    return out


def samplers(ns: Any, argv: Sequence[str]) -> list[str] | str | None:
    """The sampler chain the last of --samplers / --sampler-seq gives: a list of names, or a
    string of letters (the request field's two forms)."""
    given = [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in SAMPLER_FLAGS]
    if not given:
        return None
    if given[-1] == "--samplers":
        return [name for name in ns.samplers.split(";") if name]
    return ns.sampler_seq


def sampling_fields(ns: Any, argv: Sequence[str]) -> dict[str, Any]:
    """GraphArgs ``sampling``: each sampling option given, under its request field."""
    out: dict[str, Any] = {}
    for dest, field in FIELDS.items():
        value = getattr(ns, dest, None)
        if value is None:
            continue
        out[field] = breakers(value) if dest == "dry_sequence_breaker" else value
    if out.get("dry_base", 1.0) < 1.0:  # the reference keeps its default for a base below 1
        del out["dry_base"]
    chain = samplers(ns, argv)
    if chain is not None:
        out["samplers"] = chain
    return out
