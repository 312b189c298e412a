"""Numeric request fields at the edges of their domains: the values, the sampler context that
reads each field, and the requests built from them.

tests/test_edges.py drives them through the property test; run as a script, this module scans a
running server with every field x edge value x context, greedy and sampled, streamed and not,
and prints the requests answered with a 5xx:

    python -m tests.edges http://127.0.0.1:8110 [--out scan.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

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


# ---- the reference's answer ----------------------------------------------------------------
# Written from ../shared/spec/llama-server-native-api.md (§2.2 parsing, §2.3 field table) and
# common/sampling.cpp's common_sampler_init, not from deployments/schema.py: the schema's table is
# only checked to list the same numeric fields in the same order (tests/test_edges.py).
FLT_MAX = 3.4028234663852886e38
UINT64_MAX = 2**64 - 1


@dataclass(frozen=True)
class Spec:
    """One numeric row of the spec's field table: C type, hard limits (400) or soft ones
    (clamped), aliases; ``hard`` of ``(1, None)`` is n_cmpl's [1, n_parallel]."""

    ctype: str  # int32, int64, uint32, float
    hard: tuple | None = None
    soft: tuple | None = None
    aliases: tuple[str, ...] = ()


HARD_I32 = (0, INT32_MAX)
SPEC: dict[str, Spec] = {  # declaration order: the first error wins
    "sse_ping_interval": Spec("int32", hard=(-1, INT32_MAX)),
    "n_predict": Spec("int32", hard=(-1, INT32_MAX),
                      aliases=("max_completion_tokens", "max_tokens")),
    "n_indent": Spec("int32", hard=HARD_I32),
    "n_keep": Spec("int32", hard=(-1, INT32_MAX)),
    "n_discard": Spec("int32", hard=HARD_I32),
    "n_cmpl": Spec("int32", hard=(1, None), aliases=("n",)),
    "n_cache_reuse": Spec("int32", hard=HARD_I32),
    "t_max_predict_ms": Spec("int64", hard=(-1, INT64_MAX)),
    "top_k": Spec("int32", soft=(0, INT32_MAX)),
    "top_p": Spec("float", soft=(0.0, 1.0)),
    "min_p": Spec("float", soft=(0.0, 1.0)),
    "top_n_sigma": Spec("float"),
    "xtc_probability": Spec("float", soft=(0.0, 1.0)),
    "xtc_threshold": Spec("float", soft=(0.0, 1.0)),
    "typical_p": Spec("float"),
    "temperature": Spec("float", soft=(0.0, math.inf)),
    "dynatemp_range": Spec("float"),
    "dynatemp_exponent": Spec("float"),
    "repeat_last_n": Spec("int32", hard=HARD_I32),
    "repeat_penalty": Spec("float"),
    "frequency_penalty": Spec("float"),
    "presence_penalty": Spec("float"),
    "dry_multiplier": Spec("float"),
    "dry_base": Spec("float"),  # below 1: the server default
    "dry_allowed_length": Spec("int32", hard=HARD_I32),
    "dry_penalty_last_n": Spec("int32", hard=HARD_I32),
    "mirostat": Spec("int32", soft=(0, 2)),
    "mirostat_tau": Spec("float"),
    "mirostat_eta": Spec("float"),
    "adaptive_target": Spec("float", soft=(-FLT_MAX, 1.0)),
    "adaptive_decay": Spec("float", hard=(0.0, 0.99)),
    "seed": Spec("uint32", soft=(0, UINT32_MAX)),
    "n_probs": Spec("int32", aliases=("logprobs",)),
    "min_keep": Spec("int32", hard=HARD_I32),
    "chat_format": Spec("int32"),
    "reasoning_budget_tokens": Spec("int32", hard=(-1, INT32_MAX)),
}
DRY_BASE_DEFAULT = 1.75


class Undefined(Exception):
    """The reference's C++ conversion of this value is undefined behaviour."""


def f32(value: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def c_value(value: object, ctype: str) -> int | float:
    """What nlohmann's get<T>() makes of a JSON number: an integer beyond int64 and uint64 is
    read as a double; integers wrap into T; a double truncates, undefined outside T."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int) and not INT64_MIN <= value <= UINT64_MAX:
        value = float(value) if abs(value) < 2**1024 else math.copysign(math.inf, value)
    if ctype == "float":
        return f32(value)
    bits, signed = {"int32": (32, True), "int64": (64, True), "uint32": (32, False)}[ctype]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if isinstance(value, float):
        if not math.isfinite(value) or not lo <= math.trunc(value) <= hi:
            raise Undefined
        return math.trunc(value)
    value %= 2**bits
    return value - 2**bits if signed and value > hi else value


def std_to_string(value: int | float, ctype: str) -> str:
    return f"{value:.6f}" if ctype == "float" else str(value)


@dataclass
class Expected:
    """A 200 with these effective values (as generation_settings echoes them), or a 400 with
    this exact message, or (``named``) a 400 whose message names this field."""

    message: str | None = None
    named: str | None = None
    effective: dict = field(default_factory=dict)


def reference_answer(body: dict, n_parallel: int) -> Expected:
    """The native schema, then common_sampler_init's checks, on ``body``."""
    out = Expected()
    for name, spec in SPEC.items():
        key = next((k for k in (name, *spec.aliases) if body.get(k) is not None), None)
        if key is None:
            continue
        try:
            value = c_value(body[key], spec.ctype)
        except Undefined:
            return Expected(named=key)
        if spec.hard is not None:
            lo, hi = spec.hard[0], n_parallel if spec.hard[1] is None else spec.hard[1]
            if not lo <= value <= hi:
                return Expected(f"Field '{key}': Value must be between "
                                f"{std_to_string(lo, spec.ctype)} <= value <= "
                                f"{std_to_string(hi, spec.ctype)}, but got "
                                f"{std_to_string(value, spec.ctype)}")
        if spec.soft is not None:
            value = min(max(value, spec.soft[0]), spec.soft[1])
        out.effective[name] = value
    if out.effective.get("dry_base", DRY_BASE_DEFAULT) < 1.0:
        out.effective["dry_base"] = f32(DRY_BASE_DEFAULT)
    if out.effective.get("n_cache_reuse", 0) != 0:  # mlxray's by-design refusal (the manifest)
        return Expected(named="n_cache_reuse")
    error = sampler_init_error(out.effective)
    return Expected(f"Failed to initialize samplers: {error}") if error else out


def sampler_init_error(effective: dict) -> str | None:
    repeat = np.float32(effective.get("repeat_penalty", 1.0))
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = np.float32(1.0) / repeat
    if not (np.isfinite(repeat) and repeat > 0 and np.isfinite(reciprocal)):
        return "penalty_repeat must be finite and greater than 0"
    if not np.isfinite(np.float32(effective.get("frequency_penalty", 0.0))):
        return "penalty_freq must be finite"
    if not np.isfinite(np.float32(effective.get("presence_penalty", 0.0))):
        return "penalty_present must be finite"
    return None


def chat_reference_answer(body: dict, n_parallel: int) -> Expected:
    """/v1/chat/completions: logprobs true takes n_probs from top_logprobs (json_value: a number
    converts to int, anything else is 20); a non-boolean logprobs is read as false and copied on
    as the native alias of n_probs."""
    native = {k: v for k, v in body.items() if k not in ("logprobs", "top_logprobs")}
    if body.get("logprobs") is True:
        top = body.get("top_logprobs")
        if isinstance(top, (int, float)):
            try:
                native["n_probs"] = c_value(top, "int32")
            except Undefined:
                return Expected(named="top_logprobs")
    elif body.get("top_logprobs") is not None:
        return Expected("top_logprobs requires logprobs to be set to true")
    elif not isinstance(body.get("logprobs"), (bool, type(None))):
        native["logprobs"] = body["logprobs"]
    return reference_answer(native, n_parallel)


def expected_for(route: str, body: dict, n_parallel: int) -> Expected:
    if route == "/v1/chat/completions":
        return chat_reference_answer(body, n_parallel)
    return reference_answer(body, n_parallel)


# ---- checking an answer ----------------------------------------------------------------------
PROB_KEYS = ("logprob", "prob")
ECHOED = ("seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
          "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
          "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier",
          "dry_base", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau",
          "mirostat_eta", "adaptive_target", "adaptive_decay", "n_predict", "n_keep",
          "n_discard", "n_probs", "min_keep")


def read(response: httpx.Response, stream: bool) -> tuple[int, str, list]:
    """Status, error message and the JSON documents of an answer (a stream's frames; an error
    frame counts as its status)."""
    if response.status_code != 200:
        try:
            return response.status_code, response.json()["error"]["message"], []
        except (ValueError, KeyError, TypeError):
            return response.status_code, response.text[:200], []
    if not stream:
        return 200, "", [response.json()]
    docs = [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]
    for doc in docs:
        if isinstance(doc, dict) and "error" in doc:
            return doc["error"]["code"], doc["error"]["message"], docs
    return 200, "", docs


def _numbers(doc: object, path: str = "") -> Iterator[str]:
    """Every non-finite number, and every probability that is not a number, by path."""
    if isinstance(doc, float) and not math.isfinite(doc):
        yield path
    elif isinstance(doc, dict):
        for key, value in doc.items():
            if key in PROB_KEYS and not isinstance(value, (int, float)):
                yield f"{path}.{key}"
            elif key != "generation_settings":
                yield from _numbers(value, f"{path}.{key}")
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _numbers(value, f"{path}[{i}]")


def _settings_differ(doc: object, effective: dict) -> Iterator[str]:
    results = doc if isinstance(doc, list) else [doc]
    for result in results:
        settings = result.get("generation_settings") if isinstance(result, dict) else None
        if not isinstance(settings, dict):
            continue
        for name, value in effective.items():
            if name in ECHOED:
                want = value if math.isfinite(value) else None
                if settings.get(name) != want:
                    yield f"generation_settings.{name} {settings.get(name)!r} != {want!r}"


def problems(route: str, body: dict, response: httpx.Response, n_parallel: int) -> list[str]:
    """How the answer differs from the reference's (empty: it does not)."""
    expected = expected_for(route, body, n_parallel)
    status, message, docs = read(response, bool(body.get("stream")))
    if expected.message is not None or expected.named is not None:
        if status != 400:
            return [f"{status} {message!r}, expected 400 {expected.message or expected.named!r}"]
        if expected.message is not None and message != expected.message:
            return [f"400 {message!r}, expected {expected.message!r}"]
        if expected.named is not None and not message.startswith(f"Field '{expected.named}': "):
            return [f"400 {message!r} does not name {expected.named!r}"]
        return []
    if status != 200:
        return [f"{status} {message!r}, expected 200"]
    out = [f"non-finite number at {path}" for doc in docs for path in _numbers(doc)]
    return out + [d for doc in docs for d in _settings_differ(doc, expected.effective)]


# ---- the scan ------------------------------------------------------------------------------
def numeric_fields() -> list[str]:
    from deployments.schema import FIELDS

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
