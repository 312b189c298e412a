"""The benchmark's plumbing, without timing: its command line and the ratio arithmetic."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.ratios import (
    RATIO_NAMES,
    RequestTiming,
    compute_cpu_ratios,
    compute_ratios,
    percentile,
    ratio_lines,
    summarize,
)
from bench.report import markdown_table

from ..conftest import REPO


def test_help_runs():
    out = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--quick" in out.stdout and "--concurrency" in out.stdout


@pytest.mark.heavy
def test_runs_and_prints_its_figures_without_the_bench_extra(tmp_path):
    """matplotlib hidden (the ``bench`` extra absent): a small engine-only run still measures,
    writes its JSON and prints its table, and says how to get the plot."""
    hide = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            "runpy.run_module('bench', run_name='__main__')")
    args = ["--quick", "--no-graph", "--no-mlx-lm", "--no-peer", "--no-grammar", "--no-adapters",
            "--no-sampled", "--concurrency", "1", "--tokens", "4", "--requests", "1",
            "--prompt-tokens", "8", "--prefix-tokens", "8", "--out", str(tmp_path / "run")]
    out = subprocess.run([sys.executable, "-c", hide, *args], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| mlxray engine | 1 |" in out.stdout
    assert "no plot: matplotlib is not installed (pip install -e '.[bench]'" in out.stdout
    assert (tmp_path / "run.json").exists() and not (tmp_path / "run.png").exists()


PEER_ONLY = ["--quick", "--no-graph", "--no-mlx-lm", "--no-grammar", "--no-adapters",
             "--no-sampled", "--concurrency", "1", "--tokens", "4", "--requests", "1",
             "--prompt-tokens", "8", "--prefix-tokens", "8"]


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.heavy
def test_the_peer_is_measured_and_stopped(tmp_path):
    """mlx_lm.server is started on the model, driven by the OpenAI client for exactly the tokens
    asked (its end of generation kept out by logit_bias), reported with the peer's ratios, and
    stopped with everything it started."""
    out = subprocess.run([sys.executable, "-m", "bench", *PEER_ONLY, "--out", str(tmp_path / "r")],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "r.json").read_text())
    peer = doc["runs"]["mlx_lm_server"]["1"]
    assert peer["requests"] == 1 and peer["tokens"] == 4
    assert set(doc["runs"]) == {"engine", "mlx_lm_server"}
    assert set(RATIO_NAMES) <= set(doc["ratios"])
    assert "| mlx_lm.server (OpenAI client) | 1 |" in out.stdout
    assert "ttft_minus_mlx_lm_server_ms@1" in out.stdout
    assert _gone(doc["peer"]["pid"])
    assert not (tmp_path / "r.peer.log").exists()


@pytest.mark.heavy
def test_a_stopped_bench_stops_the_peer(tmp_path):
    """SIGTERM to the bench while mlx_lm.server runs (a session of its own, so neither a kill of
    the bench nor the terminal's Ctrl-C reaches it): the bench stops it on the way out. SIGTERM,
    not SIGINT: a shell that starts the tests in the background leaves SIGINT ignored."""
    import signal
    import time

    import psutil

    bench = subprocess.Popen([sys.executable, "-m", "bench", *PEER_ONLY, "--tokens", "4000",
                              "--out", str(tmp_path / "r")], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        peers: list = []
        while not peers and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.2)
            peers = [c for c in psutil.Process(bench.pid).children()
                     if "mlx_lm" in " ".join(c.cmdline())]
        assert peers, "the bench never started mlx_lm.server"
        time.sleep(1.0)
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=120)
        assert all(_gone(p.pid) for p in peers)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


def test_percentile_interpolates():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == 4.96
    assert math.isnan(percentile([], 50))


def test_summary_of_synthetic_requests():
    timings = [RequestTiming(0.010, 0.110, 11), RequestTiming(0.030, 0.230, 21),
               RequestTiming(0.020, 0.020, 1)]
    s = summarize(timings, wall_s=0.5)
    assert s["tokens"] == 33 and s["tokens_per_s"] == 66.0
    assert s["ttft_ms_p50"] == 20.0
    assert s["tpot_ms_p50"] == 10.0  # the single-token request has no TPOT


def _run(tps: float, ttft: float) -> dict:
    return {"tokens_per_s": tps, "ttft_ms_p50": ttft, "ttft_ms_p99": ttft,
            "tpot_ms_p50": 1.0, "tpot_ms_p99": 1.0}


def test_ratios_on_synthetic_numbers():
    runs = {"mlx_lm": {"16": _run(1000.0, 50.0)},
            "engine": {"1": _run(300.0, 12.0), "16": _run(1100.0, 40.0)},
            "graph": {"1": _run(250.0, 19.5), "16": _run(880.0, 60.0)}}
    prefix = {"cold_ttft_ms_p50": 400.0, "warm_ttft_ms_p50": 60.0}
    ratios = compute_ratios(runs, prefix)
    assert ratios["graph_vs_engine_throughput@16"] == 0.8
    assert ratios["ttft_overhead_ms@1"] == 7.5
    assert ratios["engine_vs_mlx_lm_throughput@16"] == 1.1
    assert ratios["warm_vs_cold_ttft"] == 0.15
    lines = ratio_lines(ratios)
    assert [line.split()[0] for line in lines] == [
        "graph_vs_engine_throughput@16", "ttft_overhead_ms@1",
        "engine_vs_mlx_lm_throughput@16", "warm_vs_cold_ttft",
        "graph_vs_mlx_lm_server_throughput@1", "graph_vs_mlx_lm_server_throughput@16",
        "ttft_minus_mlx_lm_server_ms@1", "ttft_vs_mlx_lm_server@16"]
    assert "MISSED" in lines[0] and "ok" in lines[1] and "ok" in lines[3]
    assert all("not measured" in line for line in lines[4:])


def test_peer_ratios_compare_the_two_openai_runs():
    runs = {"mlx_lm_server": {"1": _run(600.0, 9.0), "16": _run(1200.0, 100.0)},
            "graph_oai": {"1": _run(480.0, 15.5), "16": _run(1320.0, 105.0)},
            "graph": {"1": _run(1.0, 1.0), "16": _run(1.0, 1.0)}}
    ratios = compute_ratios(runs, None)
    assert ratios["graph_vs_mlx_lm_server_throughput@1"] == 0.8
    assert ratios["graph_vs_mlx_lm_server_throughput@16"] == 1.1
    assert ratios["ttft_minus_mlx_lm_server_ms@1"] == 6.5
    assert ratios["ttft_vs_mlx_lm_server@16"] == 1.05
    verdicts = {line.split()[0]: line for line in ratio_lines(ratios)}
    assert all("ok" in verdicts[name] for name in RATIO_NAMES[4:])


def test_cpu_ratios_invert_the_costs():
    runs = {system: {"16": {"cpu_ms_per_token": cost}}
            for system, cost in (("mlx_lm", 0.9), ("engine", 1.0), ("graph", 4.0))}
    ratios = compute_cpu_ratios(runs)
    assert ratios["graph_vs_engine_throughput@16"] == 0.25
    assert ratios["engine_vs_mlx_lm_throughput@16"] == 0.9


def test_missing_systems_give_nan_not_errors():
    ratios = compute_ratios({"engine": {"16": _run(1000.0, 1.0)}}, None)
    assert all(math.isnan(v) for v in ratios.values())
    assert all("not measured" in line for line in ratio_lines(ratios))


def test_markdown_table_lists_every_run():
    runs = {"engine": {"1": _run(300.0, 12.0), "16": _run(1100.0, 40.0)}}
    doc = {"runs": runs, "ratios": compute_ratios(runs, None), "date": "d",
           "machine": {"cpus": 2, "platform": "p"},
           "versions": {"mlx": "1", "mlx_lm": "2", "ray": "3"}}
    table = markdown_table(doc)
    assert "| mlxray engine | 16 | 1100 |" in table
    assert "| `warm_vs_cold_ttft` | — |" in table


def test_session_cpu_counts_a_sessions_processes_through_psutil():
    """A process in a session of its own that burns 0.3 s of CPU is counted there (role
    "other"), and this process is not; psutil is imported when the accounting runs, not at the
    module's top."""
    import os
    import subprocess
    import textwrap

    assert "psutil" not in module_imports(REPO / "bench" / "graph.py")
    burner = textwrap.dedent("""
        import sys, time
        while time.process_time() < 0.3:
            pass
        print("burnt", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", burner], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "burnt"
        from bench.graph import session_cpu

        used = session_cpu(proc.pid)
        assert set(used) == {"other"} and 0.25 <= used["other"] < 5  # clock ticks: 0.01 s
        assert os.getsid(0) != proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def module_imports(path) -> set[str]:
    """The top-level packages a module imports at its top level (not inside functions)."""
    import ast

    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_bench_only_packages_load_lazily():
    """The bench extra's packages (psutil, tqdm, matplotlib) are imported where they are used."""
    for path in sorted((REPO / "bench").glob("*.py")):
        assert module_imports(path) & {"psutil", "tqdm", "matplotlib"} == set(), path.name


def test_the_sampled_scenario_sends_the_default_chain_seeded_per_request():
    from bench.sampled_throughput import DEFAULT_CHAIN, SampledWorkload, ratio_lines

    body = SampledWorkload(8, [[5, 6], [7]]).body(1)
    assert body["prompt"] == [7] and body["seed"] == 1 and body["ignore_eos"]
    assert {k: body[k] for k in DEFAULT_CHAIN} == DEFAULT_CHAIN
    lines = ratio_lines({"ratios": {"sampled_vs_greedy_engine@16": 0.9,
                                    "engine_vs_mlx_lm_sampled@16": 1.1}})
    assert lines == [
        "(sampled scenario) sampled_vs_greedy_engine@16 0.900 (target >= 0.85: ok)",
        "(sampled scenario) engine_vs_mlx_lm_sampled@16 1.100 (target >= 1.2: MISSED)"]
