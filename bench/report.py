"""The benchmark's outputs: the JSON document, the PNG plot and the table in docs/performance.md."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from .ratios import RATIO_NAMES, TARGETS, meets

SYSTEMS = (("mlx_lm", "mlx-lm BatchGenerator"), ("engine", "mlxray engine"),
           ("graph", "graph over HTTP"), ("mlx_lm_server", "mlx_lm.server (OpenAI client)"),
           ("graph_oai", "graph (OpenAI client)"))
TABLE_START = "<!-- bench:table:start -->"
TABLE_END = "<!-- bench:table:end -->"


def _clean(value):
    """JSON has no nan: missing figures become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")


def write_plot(doc: dict, path: Path) -> bool:
    """The PNG plot; False (nothing written) without matplotlib (the ``bench`` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in SYSTEMS:
        levels = sorted(int(c) for c in runs.get(key, {}))
        if not levels:
            continue
        ax_tps.plot(levels, [runs[key][str(c)]["tokens_per_s"] for c in levels], "o-",
                    label=label)
        ax_ttft.plot(levels, [runs[key][str(c)]["ttft_ms_p50"] for c in levels], "o-",
                     label=f"{label} p50")
        ax_ttft.plot(levels, [runs[key][str(c)]["ttft_ms_p99"] for c in levels], "x:",
                     color=ax_ttft.lines[-1].get_color(), label=f"{label} p99")
    for ax, title, unit in ((ax_tps, "aggregate throughput", "generated tokens/s"),
                            (ax_ttft, "time to first token", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax_ttft.set_yscale("log")
    fig.suptitle(f"{doc['model_name']}, {doc['n_tokens']} tokens/request, "
                 f"{doc['machine']['cpus']} CPUs ({doc['machine']['device']})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _shown(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def markdown_table(doc: dict) -> str:
    rows = ["| system | concurrency | tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | "
            "TPOT p99 ms | CPU ms/token | tokens/HTTP chunk |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, label in SYSTEMS:
        for c in sorted(int(c) for c in doc["runs"].get(key, {})):
            r = doc["runs"][key][str(c)]
            rows.append(f"| {label} | {c} | {r['tokens_per_s']:.0f} | {r['ttft_ms_p50']:.1f} | "
                        f"{r['ttft_ms_p99']:.1f} | {r['tpot_ms_p50']:.2f} | "
                        f"{r['tpot_ms_p99']:.2f} | {r.get('cpu_ms_per_token', math.nan):.3f} | "
                        f"{_shown(r.get('tokens_per_chunk'))} |")
    lines = rows
    graph_runs = doc["runs"].get("graph", {})
    if graph_runs:
        top = str(max(int(c) for c in graph_runs))
        roles = graph_runs[top].get("cpu_ms_per_token_by_role") or {}
        if roles:
            shown = ", ".join(f"{role} {ms:.3f}" for role, ms in
                              sorted(roles.items(), key=lambda kv: -kv[1]))
            lines += ["", f"Graph CPU ms per token at {top} by process: {shown}."]
    prefix = doc.get("prefix_cache")
    if prefix:
        lines += ["", f"Prefix cache ({prefix['prompt_tokens']}-token prompt, through the graph):"
                  f" cold TTFT p50 {prefix['cold_ttft_ms_p50']:.1f} ms, warm "
                  f"{prefix['warm_ttft_ms_p50']:.1f} ms."]
    anchor = doc.get("llama_cpp")
    if anchor:
        lines += ["", f"llama.cpp (llama-cpp-python, same weights as GGUF, one request): "
                  f"{anchor['tokens_per_s']:.0f} tokens/s."]
    lines += ["", "| ratio | measured | target |", "|---|---:|---|"]
    for name in RATIO_NAMES:
        value = doc["ratios"][name]
        op, bound = TARGETS[name]
        verdict = {True: "met", False: "**missed**", None: "not measured"}[meets(name, value)]
        shown = "—" if math.isnan(value) else f"{value:.3f}"
        lines.append(f"| `{name}` | {shown} | {op} {bound:g} ({verdict}) |")
    cpu_ratios = doc.get("cpu_ratios") or {}
    if cpu_ratios:
        shown = ", ".join(f"`{k}` {_shown(v)}" for k, v in cpu_ratios.items())
        lines += ["", f"The same throughput ratios from CPU ms per token (robust to the "
                  f"neighbours' load): {shown}."]
    lines += ["", f"Measured {doc['date']} on {doc['machine']['cpus']} CPUs "
              f"({doc['machine']['platform']}), mlx {doc['versions']['mlx']}, "
              f"mlx-lm {doc['versions']['mlx_lm']}, ray {doc['versions']['ray']}."]
    return "\n".join(lines)


def update_performance_md(doc: dict, path: Path) -> None:
    """Replace the marked table block of docs/performance.md (the prose around it is kept)."""
    text = path.read_text() if path.exists() else f"{TABLE_START}\n{TABLE_END}\n"
    block = f"{TABLE_START}\n{markdown_table(doc)}\n{TABLE_END}"
    pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
    path.write_text(pattern.sub(lambda _: block, text))
