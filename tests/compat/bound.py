"""The manifest's entries and the command's options as the compat tests select and spell them."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from compat.manifest import entries
from deployments.cli import command as cli

ENTRIES = entries()
BY_ID = {e["id"]: e for e in ENTRIES}


def params(select: Callable[[dict], bool]) -> list:
    return [pytest.param(e, id=e["id"]) for e in ENTRIES if select(e)]


HONORED = {opt.dest: opt for opt in cli.HONORED}


def spellings(entry: dict) -> list[str]:
    return entry["facts"]["flags"] + entry["facts"].get("negative", [])


def option_argv(entry: dict, flag: str) -> list[str]:
    """The flag as a command line gives it: with the entry's example value when it takes one."""
    facts = entry["facts"]
    return [flag, facts.get("example", "x")] if facts.get("value") else [flag]


def parser_flags() -> set[str]:
    return {f for action in cli.parser()._actions for f in action.option_strings} - {
        "-h", "--help"}
