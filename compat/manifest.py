"""Loading, the entry schema and the canonical text of the manifest shards.

A shard is ``{"area", "title", "entries": [...]}``; every entry sits on one line, keys in the
order of ``KEYS`` and empty optional keys left out, so changing an entry's state is a one-line
edit and concurrent edits to different entries merge cleanly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "compat" / "llama-server" / "b10621"
DOC = ROOT / "docs" / "llama-server-compat.md"
README = ROOT / "README.md"

STATES = ("supported", "aliased", "not_applicable", "by_design", "deferred")
# the reference's surface (pin.json counts these), then mlxray's own additions (additions.json)
REFERENCE_KINDS = ("route", "field", "option")
KINDS = (*REFERENCE_KINDS, "addition")
# every key an entry may carry, in canonical order; the first four are required
KEYS = ("id", "kind", "state", "facts", "claim", "test", "issue", "divergence", "rationale",
        "notes")
REQUIRED = KEYS[:4]
ROUTE_FACTS = {"method": str, "path": str}
FIELD_FACTS = {"name": str, "type": str, "aliases": list, "parent": str, "example": object}
# a command-line option: its spellings, the --no-X spellings of a boolean one, its LLAMA_ARG_*
# variable, its value's placeholder (none for a switch) and a non-default value the tests pass
OPTION_FACTS = {"flags": list, "negative": list, "env": str, "value": str, "example": str}
# an addition: where it shows (a route, a request field, a command-line option, a config key, a
# method of the Python handle, or behaviour beyond the reference's) and its name there
ADDITION_FACTS = {"surface": str, "name": str}
SURFACES = ("route", "field", "option", "config", "handle", "behaviour")
ADDITION_STATES = ("supported", "deferred")
RATIONALE_KINDS = ("architectural", "policy")
RATIONALE_KEYS = ("kind", "reason", "revisit")


@dataclass
class Shard:
    path: Path
    area: str
    title: str
    entries: list[dict[str, Any]]


def entry_id(kind: str, facts: dict[str, Any]) -> str:
    """The id facts imply: ``route:POST /completion``, ``field:stream_options.include_usage``,
    ``option:--ctx-size`` (an option's first long spelling, else its first),
    ``addition:option:--dump-config``."""
    if kind == "addition":
        return f"addition:{facts.get('surface')}:{facts.get('name')}"
    if kind == "route":
        return f"route:{facts.get('method')} {facts.get('path')}"
    if kind == "option":
        return f"option:{option_name(facts.get('flags') or [])}"
    parent = facts.get("parent")
    return f"field:{parent}.{facts.get('name')}" if parent else f"field:{facts.get('name')}"


def option_name(flags: list[Any]) -> str:
    names = [f for f in flags if isinstance(f, str)]
    return next((f for f in names if f.startswith("--")), names[0] if names else "")


def load_pin(folder: Path = MANIFEST) -> dict[str, Any]:
    return json.loads((folder / "pin.json").read_text())


def shard_paths(folder: Path = MANIFEST) -> list[Path]:
    """The shards in pin.json's area order, then any stray shard (check reports those)."""
    listed = [folder / f"{area}.json" for area in load_pin(folder).get("areas", [])]
    stray = sorted(p for p in folder.glob("*.json") if p.name != "pin.json" and p not in listed)
    return listed + stray


def load_shard(path: Path) -> Shard:
    data = json.loads(path.read_text())
    return Shard(path, data.get("area", ""), data.get("title", ""), data.get("entries", []))


def load(folder: Path = MANIFEST) -> list[Shard]:
    return [load_shard(p) for p in shard_paths(folder) if p.exists()]


def entries(folder: Path = MANIFEST) -> list[dict[str, Any]]:
    return [e for shard in load(folder) for e in shard.entries]


def canonical_entry(entry: dict[str, Any]) -> dict[str, Any]:
    known = {k: entry[k] for k in KEYS if k in entry and entry[k] not in ("", [], None, {})}
    extra = {k: v for k, v in entry.items() if k not in KEYS}  # check reports these
    return {**known, **extra}


def canonical_text(shard: Shard) -> str:
    """Entries sorted by id, one per line; the shard's own keys indented by two spaces."""
    lines = [json.dumps(canonical_entry(e), ensure_ascii=False)
             for e in sorted(shard.entries, key=lambda e: str(e.get("id", "")))]
    body = ",\n".join("    " + line for line in lines)
    head = (f'{{\n  "area": {json.dumps(shard.area)},\n  "title": {json.dumps(shard.title)},\n'
            f'  "entries": [\n')
    return head + body + "\n  ]\n}\n"


def counts_by_state(items: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{kind: {state: n}} over every kind and state, zeros included (additions too)."""
    out = {kind: dict.fromkeys(STATES, 0) for kind in KINDS}
    for e in items:
        if e.get("kind") in out and e.get("state") in STATES:
            out[e["kind"]][e["state"]] += 1
    return out
