"""A real multi-node Ray cluster, in its own process: tests/multinode_cluster.py runs
configs/sharded.yaml (one rank on each device node), then configs/cluster.yaml, on one cluster of
three nodes (a CPU-only head, two nodes with one ``mlx_device`` each), apart from the suite's
one-node cluster. This test passes only if every one of its tests does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCENARIO = "tests/multinode_cluster.py"
N_SCENARIO_TESTS = 6


@pytest.mark.heavy
def test_multi_node_cluster():
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", SCENARIO, "-q", "-p", "no:warnings", "-p",
         "no:cacheprovider", "-x"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert re.search(rf"\b{N_SCENARIO_TESTS} passed\b", summary), summary
