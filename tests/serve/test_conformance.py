"""Replays every public capture of the reference llama-server against the real graph."""

from __future__ import annotations

import copy

import pytest

from ..captures import VARYING, compare, load_captures, send
from ..conftest import CAPTURES

# Captures mlxray does not match, each with its reason; a strict xfail fails once it matches.
KNOWN_DIFFERENCES = {
    "err_bad_json": "a divergence the compat manifest lists on each route reading JSON: a body "
                    "that is not JSON is a 400 invalid_request_error (the reference: 500)",
}

CAPTURE_LIST = load_captures(CAPTURES)


@pytest.mark.parametrize(
    "capture",
    [
        pytest.param(c, id=c["probe"]["name"], marks=pytest.mark.xfail(
            reason=KNOWN_DIFFERENCES[c["probe"]["name"]], strict=True))
        if c["probe"]["name"] in KNOWN_DIFFERENCES else pytest.param(c, id=c["probe"]["name"])
        for c in CAPTURE_LIST
    ],
)
def test_capture(client, capture):
    problems = compare(capture, send(client, capture["probe"]))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("capture", [pytest.param(c, id=c["probe"]["name"])
                                     for c in CAPTURE_LIST])
def test_replay_catches_a_wrong_answer(capture):
    """The replay is not vacuous: each capture's own answer passes its comparison, and the same
    answer with one value changed (a type in a shape capture, a surviving candidate's
    probability in a chain capture) fails it."""
    answer = copy.deepcopy(capture["answer"])
    assert compare(capture, answer) == []
    mode = capture["probe"]["mode"]
    if mode == "chain":
        answer["body"]["completion_probabilities"][0]["top_probs"][-1]["prob"] += 0.01
    else:
        part = "events" if "events" in answer else "body" if "body" in answer else "text"
        if part == "text":
            answer["text"] += "x"
        else:
            answer[part] = changed(answer[part], shape=mode == "shape")
    assert compare(capture, answer) != []


# compared by type, range or prefix only (tests/captures.py): generated ids, times, the build
IGNORED = {"model", "id_slot", "id"} | VARYING


def changed(value, shape: bool):
    """``value`` with its first compared leaf changed: its type in shape mode, else its value."""
    todo = [value]
    while todo:
        node = todo.pop(0)
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if (
            isinstance(node, list)) else []
        for key, leaf in items:
            if isinstance(leaf, (dict, list)):
                todo.append(leaf)
            elif not (isinstance(key, str) and (key in IGNORED or key.endswith("_ms") or
                                                 key.endswith("_per_second"))):
                node[key] = other(leaf, shape)
                return value
    raise AssertionError("no leaf to change")


def other(leaf, shape: bool):
    if isinstance(leaf, bool):
        return "yes" if shape else not leaf
    if isinstance(leaf, (int, float)):
        return str(leaf) if shape else leaf + 1
    if isinstance(leaf, str):
        return 1 if shape else leaf + "x"
    return 0
