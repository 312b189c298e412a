"""The compat manifest's command-line options bound to the ``mlxray`` command's parser: each
accepted option is the parser's with the reference's spellings, each refused one names itself."""

from __future__ import annotations

from collections import Counter

import pytest

from deployments.cli import command as cli
from deployments.cli import runtime

from .bound import ENTRIES, HONORED, option_argv, params, parser_flags, spellings

REPORTED = {note: dest for dest, note in runtime.NOTES.items()}  # claim -> the option's dest


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "option" and "claim" in e and
                                         e["state"] != "not_applicable"))
def test_claimed_option_is_the_parsers(entry):
    """An accepted option is one of the parser's, with exactly the reference's spellings and
    variable; every spelling it honors parses, and so does its variable, to the same value."""
    opt = HONORED[entry["claim"]]
    facts = entry["facts"]
    assert (list(opt.flags), list(opt.negative), opt.env) == (
        facts["flags"], facts.get("negative", []), facts.get("env"))
    assert bool(opt.kind) == bool(facts.get("value"))
    unset = getattr(cli.parse([], {}), opt.dest)
    honored = [True, False] if opt.only is None else [opt.only]
    for value in honored:
        expected = opt.kind(facts["example"]) if opt.kind else value
        for flag in opt.spellings(value):
            parsed = getattr(cli.parse(option_argv(entry, flag), {}), opt.dest)
            assert parsed == expected, flag
            if opt.only is None:  # an honored value reaches the config, not the default
                assert parsed != unset, flag
        if opt.env:
            raw = facts["example"] if opt.kind else str(int(value))
            assert getattr(cli.parse([], {opt.env: raw}), opt.dest) == expected
        if opt.kind:
            break


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "option" and "claim" in e and
                                         e["state"] != "not_applicable" and
                                         HONORED[e["claim"]].only is not None))
def test_one_way_option_refuses_the_other_way(entry):
    opt = HONORED[entry["claim"]]
    for flag in opt.spellings(not opt.only):
        with pytest.raises(cli.Refused, match=f"does not honor {flag}: {opt.reason}"):
            cli.parse([flag], {})


def reported(entry: dict) -> bool:
    """A not_applicable option the command accepts, reporting its claim at start."""
    return entry["state"] == "not_applicable" and entry.get("claim") in REPORTED


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "option" and (
    "claim" not in e or e["state"] == "not_applicable") and not reported(e)))
def test_refused_option_names_itself(entry):
    """Nothing is accepted and ignored: each spelling and the variable of an option mlxray does
    not honor stop the command at start, naming it with its reason (for not_applicable, the
    manifest's diagnostic; a deferred one keeps the command's own reason until its issue)."""
    env = entry["facts"].get("env")
    given = [(option_argv(entry, flag), {}, flag) for flag in spellings(entry)]
    given += [([], {env: "1"}, env)] if env else []
    for argv, environ, name in given:
        with pytest.raises(cli.Refused) as refused:
            cli.parse(argv, environ)
        first, *reasons = str(refused.value).splitlines()
        assert first.startswith(f"mlxray does not honor these llama-server options: {name} ")
        reason = reasons[0].removeprefix(f"  {name}: ")
        assert reason
        if entry["state"] == "not_applicable":
            assert reason == entry["claim"]


@pytest.mark.parametrize("entry", params(lambda e: e["kind"] == "option" and reported(e)))
def test_reported_option_says_why_at_start(entry):
    """Nothing is accepted silently: each spelling (and the variable) of an option that has no
    meaning here but that command lines give parses, and the command says at start, with the
    manifest's claim, that it changes nothing."""
    opt = HONORED[REPORTED[entry["claim"]]]
    facts = entry["facts"]
    given = [(option_argv(entry, flag), {}) for flag in spellings(entry)]
    given += [([], {opt.env: facts.get("example", "1")})] if opt.env else []
    for argv, environ in given:
        ns = cli.parse(argv, environ)
        shown = f" {facts['example']}" if facts.get("value") else ""
        assert runtime.notes(ns, cli.HONORED) == [f"{opt.flags[-1]}{shown}: {entry['claim']}"]


def test_every_option_the_command_knows_has_its_entry():
    """Both ways: each option the parser honors or refuses is one entry, spelled alike."""
    options = [e for e in ENTRIES if e["kind"] == "option"]
    claimed = [REPORTED[e["claim"]] if reported(e) else e["claim"] for e in options
               if e.get("claim") in HONORED or reported(e)]
    assert sorted(claimed) == sorted(HONORED)
    refused = [(frozenset(spellings(e)), e["facts"].get("env")) for e in options
               if e.get("claim") not in HONORED and not reported(e)]
    assert Counter(refused) == Counter((frozenset(u.flags), u.env) for u in cli.REFUSED)
    # and every flag the parser takes is a reference option's spelling or an addition's
    known = {f for e in options for f in spellings(e)}
    known |= {e["claim"] for e in ENTRIES if e["kind"] == "addition" and e.get("claim")
              and e["facts"]["surface"] == "option"}
    assert parser_flags() - known == set()
