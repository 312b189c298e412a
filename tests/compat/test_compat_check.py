"""``compat.check`` fails on each kind of broken manifest entry, naming it: a copy of the manifest
is broken one way per case, and the check run on it as CI runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from compat.manifest import MANIFEST, ROOT, canonical_text, entries, load, load_shard

BY_ID = {e["id"]: e for e in entries()}


def _edit(folder: Path, entry_id: str, change: Callable[[dict], None]) -> None:
    for shard in load(folder):
        for entry in shard.entries:
            if entry["id"] == entry_id:
                change(entry)
                shard.path.write_text(canonical_text(shard))
                return
    raise KeyError(entry_id)


def _duplicate(folder: Path) -> None:
    shard = load_shard(folder / "completion.json")
    shard.entries.append(dict(BY_ID["route:GET /health"]))
    shard.path.write_text(canonical_text(shard))


def _reindent(folder: Path) -> None:
    path = folder / "models-and-health.json"
    path.write_text(json.dumps(json.loads(path.read_text()), indent=4))


DEFERRED = "field:reasoning_budget_tokens"  # made a deferred entry, then broken
ADDITION = "addition:option:--dump-config"
OPEN_ISSUE = 99  # made an open issue of the copy's pin.json


def _deferred(entry: dict, **change) -> None:
    """Make ``entry`` a valid deferred one, then apply ``change``."""
    entry.update(state="deferred", issue=OPEN_ISSUE)
    entry.pop("claim", None)
    entry.update(change)


def _edit_deferred(folder: Path, change: Callable[[dict], None]) -> None:
    """In the copy: issue OPEN_ISSUE open, DEFERRED made deferred to it, then ``change``d."""
    pin = folder / "pin.json"
    data = json.loads(pin.read_text())
    data["open_issues"].append(OPEN_ISSUE)
    pin.write_text(json.dumps(data, indent=2) + "\n")
    _edit(folder, DEFERRED, change)


# mode -> (how to break a copy of the manifest, what the error line names, what it says)
BREAKS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "test_pointer": (lambda f: _edit(f, "field:n_predict", lambda e: e.update(
        test="tests/serve/test_http.py::test_no_such_test")),
        ["field:n_predict", "no test function test_no_such_test"]),
    "test_file": (lambda f: _edit(f, "field:stream", lambda e: e.update(
        test="tests/test_nowhere.py::test_x")), ["field:stream", "no file tests/test_nowhere.py"]),
    "supported_without_claim": (lambda f: _edit(f, "field:stream", lambda e: e.pop("claim")),
                                ["field:stream", "supported entry needs 'claim'"]),
    "weak_proof": (lambda f: _edit(f, "field:top_k", lambda e: e.update(
        test="tests/serve/test_fields.py::test_honored_field_changes_the_output[top_k]")),
        ["field:top_k", "only that the output changed"]),
    "divergence_without_rationale": (lambda f: _edit(f, "route:GET /health", lambda e: e.update(
        divergence=["differs"])), ["route:GET /health", "a divergence needs its rationale"]),
    "rationale_without_divergence": (lambda f: _edit(f, "route:GET /metrics", lambda e: e.update(
        rationale={"kind": "policy", "reason": "r", "revisit": "v"})),
        ["route:GET /metrics", "a rationale its divergence"]),
    "addition_not_built_or_planned": (lambda f: _edit(f, ADDITION, lambda e: e.update(
        state="not_applicable", notes="n")), [ADDITION, "an addition is supported or deferred"]),
    "addition_with_divergence": (lambda f: _edit(f, ADDITION, lambda e: e.update(
        divergence=["d"], rationale={"kind": "policy", "reason": "r", "revisit": "v"})),
        [ADDITION, "an addition has no reference to diverge from"]),
    "addition_surface": (lambda f: _edit(f, ADDITION, lambda e: e["facts"].update(
        surface="flag")), [ADDITION, "facts surface 'flag' is not one of"]),
    "by_design_without_rationale": (lambda f: _edit(f, "route:POST /tools",
                                                    lambda e: e.pop("rationale")),
                                    ["route:POST /tools", "by_design entry needs 'rationale'"]),
    "deferred_without_issue": (lambda f: _edit_deferred(f, lambda e: (_deferred(e),
                                                                     e.pop("issue"))),
                               [DEFERRED, "deferred entry needs 'issue'"]),
    "deferred_to_a_closed_issue": (lambda f: _edit_deferred(f, lambda e: _deferred(e, issue=1)),
                                   [DEFERRED, "not an open issue"]),
    "deferred_with_claim": (lambda f: _edit_deferred(f, lambda e: _deferred(e, claim="x")),
                            [DEFERRED, "deferred entry must not have 'claim'"]),
    "not_applicable_without_notes": (lambda f: _edit(f, DEFERRED, lambda e: (
        e.update(state="not_applicable", claim="x"), e.pop("notes", None))),
        [DEFERRED, "not_applicable entry needs 'notes'"]),
    "unknown_state": (lambda f: _edit(f, "field:seed", lambda e: e.update(state="partial")),
                      ["field:seed", "state 'partial'"]),
    "id_not_from_facts": (lambda f: _edit(f, "field:seed", lambda e: e["facts"].update(
        name="sead")), ["field:seed", "id must be 'field:sead'"]),
    "duplicate_id": (_duplicate, ["route:GET /health", "id appears 2 times"]),
    "count": (lambda f: _edit(f, "field:seed", lambda e: e.update(kind="route")),
              ["pin.json", "73 field entries, expected 74"]),
    "not_canonical": (_reindent, ["models-and-health.json", "not canonical"]),
    "option_id_not_from_facts": (lambda f: _edit(f, "option:--ctx-size", lambda e: e[
        "facts"].update(flags=["-c", "--context"])), ["option:--ctx-size",
                                                     "id must be 'option:--context'"]),
    "option_not_a_flag": (lambda f: _edit(f, "option:--slots", lambda e: e["facts"].update(
        negative=["no-slots"])), ["option:--slots", "'no-slots' is not a flag"]),
    "option_test_never_passes_it": (lambda f: _edit(
        f, "option:--adaptive-decay", lambda e: e.update(
        test="tests/cli/test_cli.py::test_llama_server_defaults")),
        ["option:--adaptive-decay", "never passes --adaptive-decay"]),
    "option_without_flags": (lambda f: _edit(f, "option:--port", lambda e: e["facts"].pop(
        "flags")), ["option:--port", "facts need 'flags'"]),
}


@pytest.mark.parametrize("mode", list(BREAKS))
def test_check_fails_naming_the_entry(tmp_path, mode):
    folder = tmp_path / "b10621"
    shutil.copytree(MANIFEST, folder)
    breaks, expected = BREAKS[mode]
    breaks(folder)
    run = subprocess.run([sys.executable, "-m", "compat.check", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert any(all(text in line for text in expected) for line in run.stderr.splitlines()), (
        run.stderr)
