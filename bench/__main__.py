"""python -m bench: the engine floor, the graph over HTTP and the prefix cache, side by side.

Writes ``<out>.json`` and ``<out>.png`` (default docs/bench/latest, or docs/bench/quick with
--quick), refreshes the table in docs/performance.md after a full run, and prints the target
ratios last, one per line (the peer's, mlx_lm.server driven by the same OpenAI client as the
graph, after the first four). The plot needs the ``bench`` extra (matplotlib: ``make bench``
installs it); without it the figures are measured, written and printed all the same.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import signal
import sys
import time
from pathlib import Path

from . import REPO
from .ratios import compute_cpu_ratios, compute_ratios, percentile, ratio_lines, summarize

LLAMA_GGUF = REPO.parent / "shared" / "reference" / "model.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/tiny-python", help="model folder (default: the "
                   "embedded model), or llama-27m: a random-weight Llama of realistic shape "
                   "(hidden 512, 8 layers) built at bench time (bench/models.py)")
    p.add_argument("--concurrency", default="1,4,16",
                   help="comma-separated concurrency levels (default 1,4,16)")
    p.add_argument("--tokens", type=int, default=None,
                   help="generated tokens per request (default 128; 32 with --quick)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt length (default 64)")
    p.add_argument("--prefix-tokens", type=int, default=1000,
                   help="prompt length of the prefix-cache test (default 1000)")
    p.add_argument("--requests", type=_requests, default=None,
                   help="requests per concurrency level and round: N for every level, or "
                        "C:N,... per level (default max(4, c); max(4, 2*c) with --quick)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds in which the systems take turns (default 5; 1 with --quick)")
    p.add_argument("--n-batch", type=int, default=512, help="prefill chunk (default 512)")
    p.add_argument("--out", default=None,
                   help="output path without suffix (default docs/bench/latest, "
                        "docs/bench/quick with --quick)")
    p.add_argument("--quick", action="store_true", help="fewer, shorter requests (< 3 minutes)")
    p.add_argument("--no-graph", action="store_true", help="skip the graph (engine only)")
    p.add_argument("--serve-proxy", action="store_true",
                   help="the graph's HTTP through Ray Serve's proxy, not the ingress replica")
    p.add_argument("--stream-channel", choices=["shared", "per_request"], default="shared",
                   help="the graph's stream_channel (default shared: one connection per pair "
                        "of replica processes carries every request's items)")
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's BatchGenerator")
    p.add_argument("--no-peer", action="store_true",
                   help="skip mlx_lm.server and the graph driven by the same OpenAI client")
    p.add_argument("--no-grammar", action="store_true",
                   help="skip the grammar scenario (8 sequences, half constrained)")
    p.add_argument("--no-adapters", action="store_true",
                   help="skip the adapter scenario (8 sequences, half on two LoRA adapters)")
    p.add_argument("--no-sampled", action="store_true",
                   help="skip the sampled scenario (16 sequences, llama-server's default chain)")
    return p.parse_args(argv)


ANY_LEVEL = 0


def _requests(text: str) -> dict[int, int]:
    """``--requests``: "8" (every level) or "1:4,16:16" (by level; a level not named gets the
    default)."""
    if ":" not in text:
        return {ANY_LEVEL: int(text)}
    return {int(c): int(n) for c, n in (pair.split(":") for pair in text.split(","))}


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def machine_info() -> dict:
    import mlx.core as mx

    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count(), "device": str(mx.default_device()),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}


def llama_cpp_anchor(prompt_text: str, n_tokens: int) -> dict | None:
    """llama.cpp's own speed on the same weights, when llama-cpp-python and the GGUF exist."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    if not LLAMA_GGUF.exists():
        return None
    llm = Llama(model_path=str(LLAMA_GGUF), n_ctx=2048, n_batch=512, verbose=False)
    llm(prompt_text, max_tokens=4, temperature=0.0)  # warm-up
    start = time.perf_counter()
    out = llm(prompt_text, max_tokens=n_tokens, temperature=0.0, logit_bias={
        int(t): float("-inf") for t in [llm.token_eos()]})
    wall = time.perf_counter() - start
    n = out["usage"]["completion_tokens"]
    return {"model": str(LLAMA_GGUF), "tokens": n, "wall_s": round(wall, 4),
            "tokens_per_s": round(n / wall, 2), "llama_cpp_python": _version("llama-cpp-python")}


def _cpu(system: str, serve_pid: int, peer_pid: int) -> dict[str, float]:
    """CPU seconds so far of what serves ``system``: this process for the engines driven
    directly, the graph's processes by role, mlx_lm.server's in all."""
    from .graph import session_cpu

    if system in ("graph", "graph_oai"):
        return session_cpu(serve_pid)
    if system == "mlx_lm_server":
        return {"mlx_lm.server": sum(session_cpu(peer_pid).values())}
    return {"bench process": time.process_time()}


PEER_SYSTEMS = ("mlx_lm_server", "graph_oai")


def _oai_workload(loaded, levels: list[int], rounds: int, n_requests, n_parallel: int,
                  prompt_tokens: int, n_tokens: int) -> tuple[dict, list[dict]]:
    """The OpenAI bodies of the peer comparison, by (round, level), and the warm-up's: text
    prompts that never repeat (neither server's prompt cache hits), no seed, EOS kept out."""
    from .peer import oai_body
    from .workload import make_prompts

    n = n_parallel + rounds * sum(n_requests(c) for c in levels)
    texts = [loaded.vocab.detokenize(p) for p in
             make_prompts(loaded.vocab, n, prompt_tokens, stride=prompt_tokens + 13)]
    bodies = [oai_body(t, n_tokens, sorted(loaded.vocab.eog_ids)) for t in texts]
    warmup = [{**b, "max_tokens": 8} for b in bodies[:n_parallel]]
    by_level, at = {}, n_parallel
    for r in range(rounds):
        for c in levels:
            by_level[(r, c)] = bodies[at: at + n_requests(c)]
            at += n_requests(c)
    return by_level, warmup


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the servers the bench starts live in sessions of their own: a TERM or HUP must unwind the
    # stack that stops them, as Ctrl-C does (SIGINT ignored by a background launch stays ignored)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)
    from tqdm import tqdm  # a dependency of mlx-lm's transformers: always there

    from deployments.api.config import GraphArgs
    from engine.model import load_model

    from . import engine_floor, graph, peer, report
    from .models import model_folder
    from .workload import Workload, make_prompts

    levels = sorted({int(c) for c in args.concurrency.split(",")})
    n_tokens = args.tokens or (32 if args.quick else 128)
    n_parallel = max(levels)
    n_ctx = max(2048, args.prefix_tokens + 64)
    out = REPO / (args.out or ("docs/bench/quick" if args.quick else "docs/bench/latest"))

    rounds = args.rounds or (1 if args.quick else 5)

    def n_requests(c: int) -> int:
        given = (args.requests or {}).get(c, (args.requests or {}).get(ANY_LEVEL))
        if given:
            return given
        return max(4, 2 * c) if args.quick else max(4, c)

    model_path = GraphArgs(model=model_folder(args.model)).model_path
    loaded = load_model(model_path)
    n_prompts = max(n_requests(c) for c in levels) * rounds
    work = Workload(n_tokens, make_prompts(loaded.vocab, n_prompts, args.prompt_tokens))
    warmup = Workload(8, work.prompts[:n_parallel])
    n_prefix = 2 if args.quick else 4
    prefix_prompts = make_prompts(loaded.vocab, n_prefix, args.prefix_tokens, stride=1009)

    systems = [s for s, skip in (("mlx_lm", args.no_mlx_lm), ("engine", False),
                                 ("graph", args.no_graph), ("mlx_lm_server", args.no_peer),
                                 ("graph_oai", args.no_graph or args.no_peer)) if not skip]
    oai_bodies, oai_warmup = _oai_workload(loaded, levels, rounds, n_requests, n_parallel,
                                           args.prompt_tokens, n_tokens)
    total = sum(n_requests(c) for c in levels) * len(systems) * rounds
    total += (0 if args.no_graph else 2 * n_prefix) + n_parallel * len(systems)  # + warm-up
    started = time.perf_counter()
    doc: dict = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "model": model_path, "model_name": Path(model_path).name,
                 "quick": args.quick, "n_tokens": n_tokens, "prompt_tokens": args.prompt_tokens,
                 "n_parallel": n_parallel, "n_batch": args.n_batch, "n_ctx": n_ctx,
                 "rounds": rounds, "machine": machine_info(),
                 "versions": {k: _version(k) for k in ("mlx", "mlx-lm", "ray")},
                 "workload": "closed loop, greedy, ignore_eos, cache_prompt false, distinct "
                             "prompts; the graph streams over HTTP; systems interleaved in "
                             "rounds, figures pooled over the rounds"}
    doc["versions"]["mlx_lm"] = doc["versions"].pop("mlx-lm")
    timings: dict[tuple[str, int], list] = {}
    walls: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], dict[str, float]] = {}

    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(tqdm(total=total, unit="req", file=sys.stderr,
                                       dynamic_ncols=True))
        tick = lambda: bar.update(1)  # noqa: E731
        engine = engine_floor.start_engine(loaded, n_parallel, n_ctx, args.n_batch)
        stack.callback(engine.stop)
        base, serve_pid, peer_base, peer_pid = "", 0, "", 0
        if "mlx_lm_server" in systems:
            bar.set_description("mlx_lm.server: starting")
            peer_log = out.with_suffix(".peer.log")
            peer_log.parent.mkdir(parents=True, exist_ok=True)
            peer_base, peer_pid = stack.enter_context(peer.serve_peer(model_path, n_parallel,
                                                                      peer_log))
            doc["peer"] = {"server": "mlx_lm.server", "pid": peer_pid,
                           "decode_concurrency": n_parallel}
        if "graph" in systems:
            bar.set_description("graph: starting")
            log_path = out.with_suffix(".serve.log")
            log_path.parent.mkdir(parents=True, exist_ok=True)
            base, serve_pid = stack.enter_context(graph.serve_graph(model_path, n_parallel, n_ctx,
                                                            args.n_batch, log_path,
                                                            serve_proxy=args.serve_proxy,
                                                            stream_channel=args.stream_channel))
            doc["graph_http"] = "Ray Serve's proxy" if args.serve_proxy else "ingress replica"
            doc["stream_channel"] = args.stream_channel
        runners = {
            "mlx_lm": lambda c, n, w: engine_floor.run_mlx_lm(loaded, w, c, n, n_parallel,
                                                              args.n_batch, tick),
            "engine": lambda c, n, w: engine_floor.run_engine(engine, w, c, n, tick),
            "graph": lambda c, n, w: graph.run_graph(base, w, c, n, tick),
            "mlx_lm_server": lambda c, n, w: peer.run_oai(peer_base, w, c, tick),
            "graph_oai": lambda c, n, w: peer.run_oai(base, w, c, tick),
        }
        bar.set_description("warm-up")
        for system in systems:
            runners[system](n_parallel, n_parallel,
                            oai_warmup if system in PEER_SYSTEMS else warmup)
        for r in range(rounds):
            # the systems take turns at each level, in alternating order, so that the machine's
            # load drifts over all of them alike
            order = systems if r % 2 == 0 else systems[::-1]
            for c in levels:
                offset = r * n_requests(c)
                round_work = Workload(n_tokens, work.prompts[offset:] + work.prompts[:offset])
                for system in order:
                    bar.set_description(f"round {r + 1}/{rounds} {system} c={c}")
                    cpu_before = _cpu(system, serve_pid, peer_pid)
                    used_work = oai_bodies[(r, c)] if system in PEER_SYSTEMS else round_work
                    got, wall = runners[system](c, n_requests(c), used_work)
                    for role, used in _cpu(system, serve_pid, peer_pid).items():
                        key = (system, c)
                        cpu.setdefault(key, {})
                        cpu[key][role] = cpu[key].get(role, 0.0) + used - cpu_before.get(role, 0)
                    timings.setdefault((system, c), []).extend(got)
                    walls[(system, c)] = walls.get((system, c), 0.0) + wall
        if not args.no_grammar:
            from .grammar_throughput import scenario

            bar.set_description("grammar")
            doc["grammar"] = scenario(engine, 32 if args.quick else 96, 1 if args.quick else 3)
        if not args.no_sampled:
            from .sampled_throughput import scenario as sampled_scenario

            bar.set_description("sampled")
            doc["sampled"] = sampled_scenario(engine, loaded, n_tokens, rounds if args.quick
                                              else 3, args.prompt_tokens, args.n_batch)
        if not args.no_adapters:
            from .adapter_throughput import scenario as adapter_scenario

            bar.set_description("adapters")
            doc["adapters"] = adapter_scenario(model_path, 32 if args.quick else 64,
                                               2 if args.quick else 6)
        if "graph" in systems:
            bar.set_description("prefix cache")
            cold, warm = graph.run_prefix(base, prefix_prompts, tick)
            doc["prefix_cache"] = {
                "prompt_tokens": args.prefix_tokens, "prompts": n_prefix,
                "cold_ttft_ms": [round(x, 3) for x in cold],
                "warm_ttft_ms": [round(x, 3) for x in warm],
                "cold_ttft_ms_p50": round(percentile(cold, 50), 3),
                "warm_ttft_ms_p50": round(percentile(warm, 50), 3)}
            bar.set_description("graph: stopping")
    out.with_suffix(".serve.log").unlink(missing_ok=True)
    out.with_suffix(".peer.log").unlink(missing_ok=True)
    doc["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    runs = {s: {str(c): summarize(timings[(s, c)], walls[(s, c)], cpu.get((s, c)))
                for c in levels} for s in systems}
    doc["llama_cpp"] = llama_cpp_anchor(loaded.vocab.detokenize(work.prompts[0]), n_tokens)
    doc["runs"] = runs
    doc["ratios"] = compute_ratios(runs, doc.get("prefix_cache"))
    doc["cpu_ratios"] = compute_cpu_ratios(runs)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    report.write_json(doc, out.with_suffix(".json"))
    plotted = report.write_plot(doc, out.with_suffix(".png"))
    if not args.quick and args.out is None:
        report.update_performance_md(doc, REPO / "docs" / "performance.md")
    print(report.markdown_table(doc))
    print(f"wrote {out.with_suffix('.json')}"
          + (f" and {out.with_suffix('.png')}" if plotted else "") + f" in {doc['elapsed_s']} s")
    if not plotted:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]', or make bench)")
    for name, value in doc["cpu_ratios"].items():
        print(f"(from CPU ms per token) {name} {value:.3f}")
    if "grammar" in doc:
        print(f"(grammar scenario) grammar_half_vs_free_throughput@8 {doc['grammar']['ratio']:.3f}"
              " (target >= 0.7)")
    if "adapters" in doc:
        print(f"(adapter scenario) mixed_vs_base_alone_throughput@8 "
              f"{doc['adapters']['mixed_vs_base_alone']:.3f} (from CPU ms per token: "
              f"{doc['adapters']['cpu_mixed_vs_base_alone']:.3f})")
    if "sampled" in doc:
        from .sampled_throughput import ratio_lines as sampled_lines

        for line in sampled_lines(doc["sampled"]):
            print(line)
    for line in ratio_lines(doc["ratios"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
