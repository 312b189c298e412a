"""The figures the benchmark reports: percentiles, per-run summaries and the target ratios.

Pure functions over plain numbers, so a test can check them on synthetic data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RATIO_NAMES = (
    "graph_vs_engine_throughput@16",
    "ttft_overhead_ms@1",
    "engine_vs_mlx_lm_throughput@16",
    "warm_vs_cold_ttft",
    "graph_vs_mlx_lm_server_throughput@1",
    "graph_vs_mlx_lm_server_throughput@16",
    "ttft_minus_mlx_lm_server_ms@1",
    "ttft_vs_mlx_lm_server@16",
)

# name -> (comparison, bound): the targets on the embedded model, 2-core machine
TARGETS = {
    "graph_vs_engine_throughput@16": (">=", 0.9),
    "ttft_overhead_ms@1": ("<=", 10.0),
    "engine_vs_mlx_lm_throughput@16": (">=", 1.0),
    "warm_vs_cold_ttft": ("<=", 0.2),
    "graph_vs_mlx_lm_server_throughput@1": (">=", 0.8),
    "graph_vs_mlx_lm_server_throughput@16": (">=", 1.0),
    "ttft_minus_mlx_lm_server_ms@1": ("<=", 10.0),
    "ttft_vs_mlx_lm_server@16": ("<=", 1.1),
}


@dataclass
class RequestTiming:
    """One request as its client saw it: seconds from submission."""

    ttft: float  # to the first generated token
    total: float  # to the last event
    n_tokens: int
    n_chunks: int = 0  # HTTP body chunks the client received (0: not an HTTP stream)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first; None for a single-token request."""
        if self.n_tokens < 2:
            return None
        return (self.total - self.ttft) / (self.n_tokens - 1)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(timings: list[RequestTiming], wall_s: float,
              cpu_s: dict[str, float] | None = None) -> dict:
    """Aggregate tokens/s over the run's wall time; TTFT and TPOT percentiles in milliseconds;
    CPU milliseconds per generated token, in all and by process role (``cpu_s`` in seconds)."""
    ttfts = [t.ttft * 1e3 for t in timings]
    tpots = [t.tpot * 1e3 for t in timings if t.tpot is not None]
    n_tokens = sum(t.n_tokens for t in timings)
    n_chunks = sum(t.n_chunks for t in timings)
    cpu_s = cpu_s or {}
    per_token = {role: round(used * 1e3 / n_tokens, 4) for role, used in sorted(cpu_s.items())
                 if n_tokens and used > 0}
    return {
        "requests": len(timings),
        "tokens": n_tokens,
        "wall_s": round(wall_s, 4),
        "tokens_per_s": round(n_tokens / wall_s, 2) if wall_s > 0 else math.nan,
        "ttft_ms_p50": round(percentile(ttfts, 50), 3),
        "ttft_ms_p99": round(percentile(ttfts, 99), 3),
        "tpot_ms_p50": round(percentile(tpots, 50), 3),
        "tpot_ms_p99": round(percentile(tpots, 99), 3),
        "tokens_per_chunk": round(n_tokens / n_chunks, 2) if n_chunks else math.nan,
        "cpu_ms_per_token": round(sum(per_token.values()), 4) if per_token else math.nan,
        "cpu_ms_per_token_by_role": per_token,
    }


def _at(runs: dict, system: str, concurrency: int, key: str) -> float:
    try:
        return float(runs[system][str(concurrency)][key])
    except (KeyError, TypeError):
        return math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def compute_ratios(runs: dict, prefix: dict | None) -> dict[str, float]:
    """The target figures from ``runs[system][str(concurrency)]`` summaries (systems ``mlx_lm``,
    ``engine``, ``graph``; ``graph_oai`` and ``mlx_lm_server`` for the peer, both driven by one
    OpenAI client) and the prefix-cache summary (``cold_ttft_ms_p50``, ``warm_ttft_ms_p50``); a
    figure whose inputs are missing is nan."""
    prefix = prefix or {}
    return {**_core_ratios(runs, prefix), **_peer_ratios(runs)}


def _peer_ratios(runs: dict) -> dict[str, float]:
    def both(c: int, key: str) -> tuple[float, float]:
        return _at(runs, "graph_oai", c, key), _at(runs, "mlx_lm_server", c, key)

    return {
        "graph_vs_mlx_lm_server_throughput@1": _ratio(*both(1, "tokens_per_s")),
        "graph_vs_mlx_lm_server_throughput@16": _ratio(*both(16, "tokens_per_s")),
        "ttft_minus_mlx_lm_server_ms@1": _at(runs, "graph_oai", 1, "ttft_ms_p50")
        - _at(runs, "mlx_lm_server", 1, "ttft_ms_p50"),
        "ttft_vs_mlx_lm_server@16": _ratio(*both(16, "ttft_ms_p50")),
    }


def _core_ratios(runs: dict, prefix: dict) -> dict[str, float]:
    return {
        "graph_vs_engine_throughput@16": _ratio(_at(runs, "graph", 16, "tokens_per_s"),
                                                _at(runs, "engine", 16, "tokens_per_s")),
        "ttft_overhead_ms@1": _at(runs, "graph", 1, "ttft_ms_p50")
        - _at(runs, "engine", 1, "ttft_ms_p50"),
        "engine_vs_mlx_lm_throughput@16": _ratio(_at(runs, "engine", 16, "tokens_per_s"),
                                                 _at(runs, "mlx_lm", 16, "tokens_per_s")),
        "warm_vs_cold_ttft": _ratio(float(prefix.get("warm_ttft_ms_p50", math.nan)),
                                    float(prefix.get("cold_ttft_ms_p50", math.nan))),
    }


def compute_cpu_ratios(runs: dict) -> dict[str, float]:
    """The throughput ratios again from CPU milliseconds per token (the inverse ratio of costs):
    what each system would deliver with the CPU to itself. On a shared machine wall-clock figures
    swing with the neighbours' load; CPU time per token hardly does."""
    def cost(system: str) -> float:
        return _at(runs, system, 16, "cpu_ms_per_token")

    return {
        "graph_vs_engine_throughput@16": _ratio(cost("engine"), cost("graph")),
        "engine_vs_mlx_lm_throughput@16": _ratio(cost("mlx_lm"), cost("engine")),
        "graph_vs_mlx_lm_server_throughput@16": _ratio(cost("mlx_lm_server"),
                                                       cost("graph_oai")),
    }


def meets(name: str, value: float) -> bool | None:
    """Whether a figure meets its target; None when it was not measured."""
    if math.isnan(value):
        return None
    op, bound = TARGETS[name]
    return value >= bound if op == ">=" else value <= bound


def ratio_lines(ratios: dict[str, float]) -> list[str]:
    """One line per figure, in the issue's order: ``name value (target op bound: ok|MISSED)``."""
    lines = []
    for name in RATIO_NAMES:
        value = ratios[name]
        op, bound = TARGETS[name]
        verdict = {True: "ok", False: "MISSED", None: "not measured"}[meets(name, value)]
        lines.append(f"{name} {value:.3f} (target {op} {bound:g}: {verdict})")
    return lines
