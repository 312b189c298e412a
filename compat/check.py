"""``python -m compat.check [--fix] [FOLDER]``: validate the manifest; exit 1 naming each bad entry.

Checks the entry schema (routes, fields, command-line options and mlxray's own additions), the
state rules (supported: a claim and a test that is more than "the output changed", and any
divergence listed with its rationale;
aliased: the name it maps to and a test, no divergence; not_applicable: notes, the diagnostic as
its claim and a test; by_design: a divergence, a rationale and a test; deferred: an open issue, no
claim; an addition is supported or deferred and diverges from nothing), unique ids, the counts of
pin.json, that every ``test`` pointer names an existing test function (test files are parsed,
never imported), that a supported or aliased option's test passes the option (compat/proofs.py)
and that every shard is in canonical form.
``--fix`` rewrites the shards canonically (sorted entries, one per line) before checking.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from .manifest import (
    ADDITION_FACTS,
    ADDITION_STATES,
    FIELD_FACTS,
    KEYS,
    KINDS,
    MANIFEST,
    OPTION_FACTS,
    RATIONALE_KEYS,
    RATIONALE_KINDS,
    REFERENCE_KINDS,
    REQUIRED,
    ROOT,
    ROUTE_FACTS,
    STATES,
    SURFACES,
    Shard,
    canonical_text,
    entry_id,
    load_shard,
    shard_paths,
)
from .proofs import option_proof_problem

HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@cache
def test_names(path: Path) -> frozenset[str]:
    """``func`` and ``Class::method`` for every test function of a test file, read with ast."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return frozenset()
    names: set[str] = set()
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, funcs) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f"{node.name}::{m.name}" for m in node.body
                      if isinstance(m, funcs) and m.name.startswith("test")}
    return frozenset(names)


def pointer_problem(pointer: str, root: Path = ROOT) -> str | None:
    """Why ``tests/file.py::function[param]`` names no test, or None when it does."""
    file, sep, name = pointer.partition("::")
    name = name.split("[", 1)[0]
    if not sep or not file.endswith(".py") or not name:
        return f"test pointer {pointer!r} is not 'file.py::function'"
    path = (root / file).resolve()
    if not path.is_file() or root.resolve() not in path.parents:
        return f"test pointer {pointer!r}: no file {file}"
    if name not in test_names(path):
        return f"test pointer {pointer!r}: no test function {name} in {file}"
    return None


def _typed(entry: dict, key: str, kind: type) -> bool:
    return key not in entry or isinstance(entry[key], kind)


def schema_problems(entry: dict) -> list[str]:
    problems = [f"missing key {k!r}" for k in REQUIRED if k not in entry]
    problems += [f"unknown key {k!r}" for k in entry if k not in KEYS]
    for key, kind in (("id", str), ("claim", str), ("test", str), ("notes", str),
                      ("facts", dict), ("divergence", list), ("rationale", dict)):
        if not _typed(entry, key, kind):
            problems.append(f"{key!r} must be a {kind.__name__}")
    issue = entry.get("issue")
    if issue is not None and (not isinstance(issue, int) or isinstance(issue, bool)):
        problems.append("'issue' must be an issue number")
    if entry.get("kind") not in KINDS:
        problems.append(f"kind {entry.get('kind')!r} is not one of {', '.join(KINDS)}")
    if entry.get("state") not in STATES:
        problems.append(f"state {entry.get('state')!r} is not one of {', '.join(STATES)}")
    if isinstance(entry.get("divergence"), list) and not all(
            isinstance(d, str) and d.strip() for d in entry["divergence"]):
        problems.append("'divergence' must list non-empty strings")
    problems += _rationale_problems(entry.get("rationale"))
    if isinstance(entry.get("facts"), dict) and entry.get("kind") in KINDS:
        problems += _facts_problems(entry["kind"], entry["facts"])
        expected = entry_id(entry["kind"], entry["facts"])
        if entry.get("id") != expected:
            problems.append(f"id must be {expected!r} (from its facts)")
    return problems


def _rationale_problems(rationale: Any) -> list[str]:
    if not isinstance(rationale, dict):
        return []
    problems = [f"rationale needs {k!r}" for k in RATIONALE_KEYS
                if not isinstance(rationale.get(k), str) or not rationale[k].strip()]
    problems += [f"rationale has unknown key {k!r}" for k in rationale if k not in RATIONALE_KEYS]
    if rationale.get("kind") not in RATIONALE_KINDS:
        problems.append(f"rationale kind must be one of {', '.join(RATIONALE_KINDS)}")
    return problems


FACTS = {"route": (ROUTE_FACTS, ("method", "path")), "field": (FIELD_FACTS, ("name", "type")),
         "option": (OPTION_FACTS, ("flags",)), "addition": (ADDITION_FACTS, ("surface", "name"))}


def _facts_problems(kind: str, facts: dict) -> list[str]:
    spec, required = FACTS[kind]
    problems = [f"facts need {k!r}" for k in required if not facts.get(k)]
    for key, value in facts.items():
        if key not in spec:
            problems.append(f"facts have unknown key {key!r}")
        elif not isinstance(value, spec[key]):
            problems.append(f"facts {key!r} must be a {spec[key].__name__}")
    if kind == "route" and facts.get("method") not in HTTP_METHODS:
        problems.append(f"facts method {facts.get('method')!r} is not an HTTP method")
    if kind == "option":
        problems += _spelling_problems(facts)
    if kind == "addition" and facts.get("surface") not in SURFACES:
        problems.append(f"facts surface {facts.get('surface')!r} is not one of "
                        f"{', '.join(SURFACES)}")
    return problems


def _spelling_problems(facts: dict) -> list[str]:
    """Flags are command-line spellings (``-c``, ``--ctx-size``), each given once; a
    ``--no-X`` spelling belongs in ``negative``; the variable is an environment name."""
    spellings = [f for key in ("flags", "negative") if isinstance(facts.get(key), list)
                 for f in facts[key]]
    problems = [f"facts spelling {f!r} is not a flag" for f in spellings
                if not isinstance(f, str) or not f.startswith("-") or " " in f]
    if len(spellings) != len(set(map(str, spellings))):
        problems.append("facts spell a flag twice")
    env = facts.get("env")
    if isinstance(env, str) and not env.replace("_", "").isalnum():
        problems.append(f"facts env {env!r} is not an environment variable name")
    return problems


# tests that show only that something happens, not that it is what the reference does: no
# served entry may rest on them
WEAK_PROOFS = {
    "tests/serve/test_fields.py::test_honored_field_changes_the_output":
        "only that the output changed (a wrong sampler changes it too)",
}

# the inventory's rules for each state: (key, needed) pairs
RULES = {
    "supported": [("claim", True), ("test", True)],
    "aliased": [("claim", True), ("test", True), ("divergence", False)],
    "not_applicable": [("notes", True), ("claim", True), ("test", True)],
    "by_design": [("divergence", True), ("rationale", True), ("test", True)],
    "deferred": [("issue", True), ("claim", False)],
}


def state_problems(entry: dict, open_issues: list[int]) -> list[str]:
    """The state rules; a recorded divergence always comes with its rationale."""
    state = entry.get("state")
    has = {k: bool(entry.get(k)) for k in KEYS}
    problems = [f"{state} entry {'needs' if need else 'must not have'} {key!r}"
                for key, need in RULES.get(state, []) if has[key] != need]
    if has["divergence"] != has["rationale"]:
        problems.append("a divergence needs its rationale, and a rationale its divergence")
    if entry.get("kind") == "addition":
        if state not in ADDITION_STATES:
            problems.append(f"an addition is {' or '.join(ADDITION_STATES)}, not {state}")
        if has["divergence"]:
            problems.append("an addition has no reference to diverge from: say what it does "
                            "in 'notes'")
    if state != "deferred" and entry.get("issue") is not None:
        problems.append(f"{state} entry must not have 'issue' (only deferred entries do)")
    issue = entry.get("issue")
    if state == "deferred" and isinstance(issue, int) and issue not in open_issues:
        problems.append(f"deferred to issue #{issue}, which is not an open issue in pin.json")
    if entry.get("test"):
        problem = pointer_problem(entry["test"])
        if problem:
            problems.append(problem)
        if entry.get("kind") == "option" and state in ("supported", "aliased") and not problem:
            problem = option_proof_problem(entry, ROOT)
            if problem:
                problems.append(problem)
        weak = WEAK_PROOFS.get(entry["test"].split("[", 1)[0])
        if weak and state in ("supported", "aliased"):
            problems.append(f"{entry['test']} proves {weak}: name a capture replay or a test "
                            "against the reference's behaviour or a hand-computed expectation")
    return problems


def pin_problems(pin: dict) -> list[str]:
    problems = []
    for key in ("reference", "captures", "counts", "areas", "open_issues"):
        if key not in pin:
            problems.append(f"pin.json: missing {key!r}")
    counts = pin.get("counts", {})
    if not isinstance(counts, dict) or set(counts) != set(REFERENCE_KINDS):
        problems.append(f"pin.json: 'counts' must give {', '.join(REFERENCE_KINDS)}")
    return problems


def check(folder: Path = MANIFEST, fix: bool = False) -> list[str]:
    """Every problem of the manifest in ``folder``, each naming its shard and entry."""
    try:
        pin = json.loads((folder / "pin.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"pin.json: {exc}"]
    problems = pin_problems(pin)
    areas = pin.get("areas", [])
    seen: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for path in shard_paths(folder):
        shard, shard_errors = _read_shard(path, areas)
        problems += shard_errors
        if shard is None:
            continue
        if fix:
            path.write_text(canonical_text(shard))
        elif path.read_text() != canonical_text(shard):
            problems.append(f"{path.name}: not canonical (run python -m compat.check --fix)")
        for entry in shard.entries:
            where = f"{path.name}: {entry.get('id', '<no id>')}"
            seen[entry.get("id", "")] += 1
            kinds[entry.get("kind", "")] += 1
            errors = schema_problems(entry) or state_problems(entry, pin.get("open_issues", []))
            problems += [f"{where}: {e}" for e in errors]
    problems += [f"{i}: id appears {n} times" for i, n in seen.items() if n > 1]
    for kind, expected in pin.get("counts", {}).items():
        if kinds[kind] != expected:
            problems.append(f"pin.json: {kinds[kind]} {kind} entries, expected {expected}")
    return problems


def _read_shard(path: Path, areas: list[str]) -> tuple[Shard | None, list[str]]:
    if not path.exists():
        return None, [f"{path.name}: listed in pin.json areas but missing"]
    try:
        shard = load_shard(path)
    except json.JSONDecodeError as exc:
        return None, [f"{path.name}: not JSON: {exc}"]
    problems = []
    if path.stem not in areas:
        problems.append(f"{path.name}: area not listed in pin.json 'areas'")
    if shard.area != path.stem or not shard.title:
        problems.append(f"{path.name}: 'area' must be {path.stem!r} and 'title' non-empty")
    if not isinstance(shard.entries, list) or not all(isinstance(e, dict) for e in shard.entries):
        return None, problems + [f"{path.name}: 'entries' must be a list of objects"]
    return shard, problems


def main(argv: list[str]) -> int:
    fix = "--fix" in argv
    rest = [a for a in argv if a != "--fix"]
    folder = Path(rest[0]) if rest else MANIFEST
    problems = check(folder, fix=fix)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"compat.check: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"compat.check: {folder.relative_to(ROOT) if ROOT in folder.parents else folder} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
