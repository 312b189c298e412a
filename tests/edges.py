"""Numeric request fields at the edges of their domains: the values, the sampler context that
reads each field, and the requests built from them.

tests/serve/test_edges.py drives them through the property test; run as a script, this module
scans a
running server with every field x edge value x context, greedy and sampled, streamed and not,
and prints the requests answered with a 5xx or otherwise than the reference
(tests/edge_oracle.py):

    python -m tests.edges http://127.0.0.1:8110 [--out scan.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator

import httpx

from .edge_oracle import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, UINT32_MAX, problems, read

# the edges: 0, +-1, +-0.5, the int32/uint32/int64 bounds and one past them, values that
# overflow float32 (and one that does not even fit a double's float32 conversion), tiny ones
EDGES: tuple[int | float, ...] = (
    0, 1, -1, 0.5, -0.5,
    INT32_MAX, INT32_MAX + 1, INT32_MIN, INT32_MIN - 1,
    UINT32_MAX, UINT32_MAX + 1,
    INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1,
    1e39, -1e39, 1e308, -1e308, 1e-30, -1e-30,
)

# the byte-fallback tokens of the embedded model (ids 3..258): banned in every request, as the
# reference captures did, so that a 500 for invalid UTF-8 output (the reference's own answer to
# such text) cannot hide a real failure
BYTE_TOKENS = range(3, 259)
NO_BYTES = [[t, False] for t in BYTE_TOKENS]
REPEATS = "x = 1\nx = 1\nx = 1\nx = 1\nx = 1\nx = 1\n"

# the sampler that reads each field, switched on so the value is used
CONTEXTS: dict[str, dict] = {
    "mirostat": {"mirostat": 2},
    "mirostat_tau": {"mirostat": 1},
    "mirostat_eta": {"mirostat": 2},
    "dry_multiplier": {"prompt": REPEATS, "dry_sequence_breakers": ["@"]},
    "dry_base": {"prompt": REPEATS, "dry_multiplier": 1.0, "dry_sequence_breakers": ["@"]},
    "dry_allowed_length": {"prompt": REPEATS, "dry_multiplier": 1.0,
                           "dry_sequence_breakers": ["@"]},
    "dry_penalty_last_n": {"prompt": REPEATS, "dry_multiplier": 1.0,
                           "dry_sequence_breakers": ["@"]},
    "xtc_probability": {"xtc_threshold": 0.05},
    "xtc_threshold": {"xtc_probability": 1.0},
    "dynatemp_range": {"dynatemp_exponent": 1.0},
    "dynatemp_exponent": {"dynatemp_range": 0.5},
    "adaptive_target": {"samplers": ["top_k", "adaptive_p"]},
    "adaptive_decay": {"samplers": ["top_k", "adaptive_p"], "adaptive_target": 0.3},
    "repeat_penalty": {"prompt": REPEATS},
    "repeat_last_n": {"prompt": REPEATS, "repeat_penalty": 1.5},
    "frequency_penalty": {"prompt": REPEATS},
    "presence_penalty": {"prompt": REPEATS},
    "min_keep": {"min_p": 0.9, "top_p": 0.1},
    "n_probs": {"post_sampling_probs": True},
    "top_n_sigma": {"top_k": 0},
}
# a second context for the fields two samplers read
ALSO: dict[str, dict] = {
    "mirostat_tau": {"mirostat": 2},
    "mirostat_eta": {"mirostat": 1},
    "temperature": {"mirostat": 2},
    "adaptive_target": {"samplers": ["adaptive_p"], "adaptive_decay": 0.0},
    "n_probs": {},
}

BASE = {"prompt": "def main():\n", "n_predict": 4, "cache_prompt": False, "seed": 7,
        "n_probs": 2}
MODES = {"greedy": {"temperature": 0}, "sampled": {"temperature": 1.0}}


def body_for(name: str, value: object, context: dict, mode: str, stream: bool) -> dict:
    """One native request: the base, the mode, the sampler context, then the field's value."""
    body = {**BASE, **MODES[mode], "logit_bias": NO_BYTES, **context, name: value}
    if stream:
        body["stream"] = True
    return body


def contexts(name: str) -> list[dict]:
    return [CONTEXTS.get(name, {})] + ([ALSO[name]] if name in ALSO else [])


# ---- the OpenAI routes' own fields -----------------------------------------------------------
OAI_COMPLETION_FIELDS = ("max_tokens", "logprobs", "n", "presence_penalty", "frequency_penalty",
                         "temperature", "top_p", "seed")
OAI_CHAT_FIELDS = ("max_tokens", "max_completion_tokens", "top_logprobs", "n",
                   "presence_penalty", "frequency_penalty", "temperature", "top_p", "seed")
CHAT_BASE = {"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 4,
             "seed": 7}


def oai_body(route: str, name: str, value: object, mode: str, stream: bool) -> dict:
    if route == "/v1/completions":
        body = {"prompt": "def main():\n", "max_tokens": 4, "seed": 7, "logprobs": 2}
    else:
        body = {**CHAT_BASE, "logprobs": True, "top_logprobs": 2}
    body.update(MODES[mode], logit_bias=NO_BYTES)
    body[name] = value
    if stream:
        body["stream"] = True
    return body


# ---- the scan ------------------------------------------------------------------------------
def numeric_fields() -> list[str]:
    from deployments.api.schema import FIELDS

    return [f.name for f in FIELDS if f.kind in ("int32", "int64", "uint32", "float")]


def requests() -> Iterator[tuple[str, dict]]:
    """(route, body) of every scanned request."""
    for name in numeric_fields():
        for context in contexts(name):
            for value in EDGES:
                for mode in MODES:
                    for stream in (False, True):
                        yield "/completion", body_for(name, value, context, mode, stream)
    for route, names in (("/v1/completions", OAI_COMPLETION_FIELDS),
                         ("/v1/chat/completions", OAI_CHAT_FIELDS)):
        for name in names:
            for value in EDGES:
                for mode in MODES:
                    for stream in (False, True):
                        yield route, oai_body(route, name, value, mode, stream)


def short(body: dict) -> dict:
    """The body without the byte-token ban and the base, for the report."""
    drop = {"logit_bias": NO_BYTES, **{k: v for k, v in BASE.items() if k != "prompt"},
            "prompt": BASE["prompt"]}
    return {k: v for k, v in body.items() if drop.get(k, object()) != v or k == "n_probs"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.edges", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base", help="server URL, e.g. http://127.0.0.1:8110")
    p.add_argument("--out", help="write every request and its answer here (JSON)")
    p.add_argument("--n-parallel", type=int, default=4, help="the server's slots (-np)")
    args = p.parse_args(argv)
    answers, statuses, n_differ = [], Counter(), 0
    with httpx.Client(base_url=args.base, timeout=300) as client:
        for n, (route, body) in enumerate(requests(), 1):
            r = client.post(route, json=body)
            status, message, _ = read(r, bool(body.get("stream")))
            differs = problems(route, body, r, args.n_parallel)
            statuses[status] += 1
            n_differ += bool(differs)
            answers.append({"route": route, "body": short(body), "status": status,
                            "message": message, "differs": differs})
            if status >= 500 or differs:
                print(f"{status} {route} {json.dumps(short(body))}: {message} {differs}",
                      flush=True)
            if n % 500 == 0:
                print(f"... {n} requests, {dict(statuses)}", file=sys.stderr, flush=True)
        healthy = client.get("/health").status_code
    failures = sum(n for status, n in statuses.items() if status >= 500)
    print(f"{sum(statuses.values())} requests, by status {dict(statuses)}; "
          f"{failures} answered 5xx, {n_differ} differ from the reference; "
          f"/health {healthy} afterwards")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(answers, f, indent=0)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
