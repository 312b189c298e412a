"""``python -m compat.record BASE_URL PROBES [OUT_DIR] [--only NAME ...]``: send each probe of a
probe set to a freshly started reference llama-server and write its answer as a capture
(``{"probe": ..., "answer": {"status", "content_type", "body" | "events"}}``), the format of
``tests/fixtures/captures`` and ``../shared/reference/compare.py``.

A probe set is a Python module with ``PROBES`` (a list of probes: name, method, path, body, mode;
``order`` is given here, after the highest order already in OUT_DIR). The reference to record
from: ../shared/reference/README.md (b10587 built from the fetched snapshot, run with
``-m model.gguf -np 4 -c 8192 -b 64 -ub 64 -a tiny-python --metrics -fa off -ctk f32 -ctv f32``).
The script never runs in CI; the captures it writes are replayed there
(tests/serve/test_conformance.py)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from compat.answers import parse_answer

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "captures"


def send(base: str, probe: dict) -> dict:
    data = json.dumps(probe["body"]).encode() if "body" in probe else None
    req = urllib.request.Request(base + probe["path"], data=data,
                                 method=probe.get("method", "POST"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            status, ctype, raw = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as err:
        status, ctype, raw = err.code, err.headers.get("Content-Type", ""), err.read()
    return parse_answer(status, ctype, raw)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base_url")
    ap.add_argument("probes", help="a module with PROBES, e.g. compat.probes.chain_grid")
    ap.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    probes = importlib.import_module(args.probes).PROBES
    orders = [json.loads(p.read_text())["probe"].get("order", 0) for p in args.out.glob("*.json")]
    order = max(orders, default=0)
    for probe in probes:
        if args.only and probe["name"] not in args.only:
            continue
        order += 1
        probe = {**probe, "order": order}
        answer = send(args.base_url.rstrip("/"), probe)
        path = args.out / f"{probe['name']}.json"
        path.write_text(json.dumps({"probe": probe, "answer": answer}, indent=1,
                                   ensure_ascii=False) + "\n")
        print(f"{probe['name']}: {answer['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
