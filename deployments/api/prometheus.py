"""llama-server's /metrics as data: the reference's metric names, types and help texts, the
values from an engine's snapshot (engine/tasks.py), and the Prometheus text exposition.

A model of several replicas answers with their sum (``combined_values``): every counter is the
total over the replicas it ever had (deployments/serve/status.py remembers those that went
away), ``n_tokens_max`` the largest of them, ``n_busy_slots_per_decode`` the average over every
replica's decode calls; the gauges of the moment are summed over the live replicas: the
throughputs (replicas work side by side: the model's combined tokens per second) and the
requests processing and deferred."""

from __future__ import annotations

# the reference's metrics in its order (counters, then gauges) with its help texts
METRIC_HELP = {
    "prompt_tokens_total": ("counter", "Number of prompt tokens processed."),
    "prompt_tokens_cached_total": ("counter", "Number of prompt tokens taken from the cache."),
    "prompt_seconds_total": ("counter", "Prompt process time"),
    "tokens_predicted_total": ("counter", "Number of generation tokens processed."),
    "tokens_predicted_seconds_total": ("counter", "Predict process time"),
    "n_decode_total": ("counter", "Total number of llama_decode() calls"),
    "n_tokens_max": ("counter", "Largest observed n_tokens."),
    "spec_decode_num_draft_tokens_total": ("counter", "Number of speculative draft tokens."),
    "spec_decode_num_accepted_tokens_total": ("counter",
                                              "Number of accepted speculative draft tokens."),
    "spec_decode_num_drafts_total": ("counter", "Number of speculative drafts."),
    "prompt_tokens_seconds": ("gauge", "Average prompt throughput in tokens/s."),
    "predicted_tokens_seconds": ("gauge", "Average generation throughput in tokens/s."),
    "requests_processing": ("gauge", "Number of requests processing."),
    "requests_deferred": ("gauge", "Number of requests deferred."),
    "n_busy_slots_per_decode": ("gauge", "Average number of busy slots per llama_decode() call"),
}
# mlxray's own, after the reference's and only with --cache-disk: the default text stays its
DISK_METRIC_HELP = {
    "cache_disk_hits_total": ("counter", "Number of prompts whose cache was read from the disk "
                                         "tier (--cache-disk)."),
    "prompt_tokens_cache_disk_total": ("counter", "Number of prompt tokens read from the disk "
                                                  "tier (counted in prompt_tokens_cached_total "
                                                  "too)."),
}
SUMMED_GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing",
                 "requests_deferred")


def counter_values(m: dict) -> dict[str, float]:
    """The reference's counters (and the busy-slots average made of two) from engine totals."""
    return {
        "prompt_tokens_total": m["prompt_tokens_total"],
        "prompt_tokens_cached_total": m["prompt_tokens_cached_total"],
        "prompt_seconds_total": m["prompt_seconds_total"],
        "tokens_predicted_total": m["tokens_predicted_total"],
        "tokens_predicted_seconds_total": m["tokens_predicted_seconds_total"],
        "n_decode_total": m["n_decode_total"],
        "n_tokens_max": m["n_tokens_max"],
        "spec_decode_num_draft_tokens_total": m.get("spec_decode_num_draft_tokens_total", 0),
        "spec_decode_num_accepted_tokens_total": m.get("spec_decode_num_accepted_tokens_total", 0),
        "spec_decode_num_drafts_total": m.get("spec_decode_num_drafts_total", 0),
        "n_busy_slots_per_decode": m["n_busy_slots_total"] / max(1, m["n_decode_total"]),
    }


def gauge_values(m: dict) -> dict[str, float]:
    """The gauges of the moment; the throughputs cover the time since the previous scrape."""
    return {
        "prompt_tokens_seconds": (m["bucket_prompt_tokens"] / m["bucket_prompt_seconds"]
                                  if m["bucket_prompt_seconds"] > 0 else 0.0),
        "predicted_tokens_seconds": (m["bucket_predicted_tokens"] / m["bucket_predicted_seconds"]
                                     if m["bucket_predicted_seconds"] > 0 else 0.0),
        "requests_processing": m["n_processing"],
        "requests_deferred": m["n_deferred"],
    }


def metric_values(m: dict) -> dict[str, float]:
    """The reference's values from one engine's snapshot."""
    return {**counter_values(m), **gauge_values(m)}


def combined_values(totals: dict, snapshots: list[dict]) -> dict[str, float]:
    """A model's values: counters from ``totals`` (every replica's, gone ones included), gauges
    summed over the ``snapshots`` of its live replicas."""
    gauges = [gauge_values(s) for s in snapshots]
    return {**counter_values(totals),
            **{name: sum(g[name] for g in gauges) for name in SUMMED_GAUGES}}


def _value(value: float) -> str:
    return f"{float(value):g}"  # as C++'s ostream prints a double (%g: six significant digits)


def exposition(values: dict[str, float], own: dict[str, float] | None = None) -> str:
    """Prometheus text as the reference writes it: HELP, TYPE and the sample of each metric;
    then mlxray's ``own`` metrics, prefixed ``mlxray:``."""
    lines = []
    for prefix, helps, vals in (("llamacpp", METRIC_HELP, values),
                                ("mlxray", DISK_METRIC_HELP, own or {})):
        for name, (kind, help_text) in helps.items():
            if name in vals:
                lines += [f"# HELP {prefix}:{name} {help_text}",
                          f"# TYPE {prefix}:{name} {kind}",
                          f"{prefix}:{name} {_value(vals[name])}"]
    return "\n".join(lines) + "\n"


def disk_metric_values(m: dict, cache_disk: str | None) -> dict[str, float]:
    """The disk tier's counters, none without one."""
    return {name: m.get(name, 0) for name in DISK_METRIC_HELP} if cache_disk else {}


def labelled_exposition(series: list[tuple[dict[str, str], dict[str, float]]]) -> str:
    """The same metrics, one sample per (labels, values) pair: the per-replica view."""
    lines = []
    for name, (kind, help_text) in METRIC_HELP.items():
        lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}"]
        for labels, values in series:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"llamacpp:{name}{{{text}}} {_value(values[name])}")
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
