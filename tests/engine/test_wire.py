"""engine/wire.py: the codec of the stream channel and the sharded ranks' broadcast carries the
engine's dataclasses and plain data exactly, and refuses what is not one of its frames (a pickle
above all) without running anything."""

from __future__ import annotations

import enum
import pickle

import msgpack
import numpy as np
import pytest

from deployments.serve.channel import ITEMS
from engine.lockstep import TURNS
from engine.types import (
    ErrorEvent,
    FinalEvent,
    GenerationRequest,
    GrammarTrigger,
    ReasoningBudget,
    SamplingParams,
    Timings,
    TokenEvent,
    TokenProb,
    TokenProbs,
)
from engine.wire import DATACLASS, Codec, WireError

TIMINGS = Timings(cache_n=1, prompt_n=2, prompt_ms=3.5, predicted_n=4, predicted_ms=5.25)


class Level(enum.IntEnum):
    HIGH = 3


def test_events_and_sse_items_travel_exactly():
    probs = TokenProbs(7, b"\xe2\x82", -0.5, [TokenProb(7, b"\xe2\x82", -0.5),
                                              TokenProb(9, b"x", -2.0)])
    frame = [(1, [TokenEvent(0, 7, "é", 1, 3, TIMINGS, probs, n_cache=2)]),
             (2, [FinalEvent(0, 1, "done", [1, 2], "eos", "", 3, 2, 0, False, True, TIMINGS,
                             probs=[probs])]),
             (3, [ErrorEvent(0, 400, "too long", "invalid_request_error",
                             {"n_prompt_tokens": 9, "n_ctx": 8})]),
             (4, b"data: {}\n\n")]
    assert ITEMS.loads(ITEMS.dumps(frame)) == frame


def test_a_sharded_turn_travels_exactly_tuples_and_all():
    request = GenerationRequest(
        [1, 2, 3], SamplingParams(logit_bias=[(5, None), (6, 1.5)], seed=11), stop=["\n\n"],
        reasoning_budget=ReasoningBudget(8, [1], [[2, 3]]),
        grammar_triggers=[GrammarTrigger(1, "<tool>")], adapters=(("a.safetensors", 0.5),))
    turn = (12.5, [("submit", (4, [(request, 11, 9)])), ("cancel", 3), ("stop", None)])
    back = TURNS.loads(TURNS.dumps(turn))
    assert back == turn
    assert back[1][0][1][1][0][0].adapters == (("a.safetensors", 0.5),)  # hashable, as sent


def test_numbers_of_other_types_go_as_plain_numbers():
    assert ITEMS.loads(ITEMS.dumps([np.int64(5), np.float32(0.5), Level.HIGH, True])) == [
        5, 0.5, 3, True]


class Planted:
    ran: list = []

    @staticmethod
    def run(*args) -> str:
        Planted.ran.append(args)
        return "planted"

    def __reduce__(self):
        return Planted.run, ("executed",)


@pytest.mark.parametrize("data", [
    pickle.dumps([(1, Planted())]),
    pickle.dumps([(1, Planted())], protocol=0),
    b"",
    msgpack.packb([msgpack.ExtType(DATACLASS, b"Planted"), "executed"]),  # a class not its own
    msgpack.packb([msgpack.ExtType(DATACLASS, b"Timings"), 1, 2]),  # the wrong field count
    msgpack.packb([1, msgpack.ExtType(DATACLASS, b"Timings")]),  # a class mark out of place
    msgpack.packb({"k": msgpack.ExtType(DATACLASS, b"Timings")}),
    msgpack.packb(msgpack.ExtType(9, b"")),
], ids=["pickle", "pickle-0", "empty", "foreign-class", "field-count", "mark-inside",
        "mark-in-map", "unknown-ext"])
def test_what_is_not_a_frame_is_refused_and_runs_nothing(data):
    Planted.ran.clear()
    with pytest.raises(WireError):
        ITEMS.loads(data)
    assert Planted.ran == []


def test_objects_outside_the_codec_are_not_packed():
    with pytest.raises(WireError, match="not plain data"):
        ITEMS.dumps([(1, Planted())])
    with pytest.raises(WireError, match="not plain data"):
        Codec((Timings,)).dumps(TokenProb(1, b"x", 0.0))  # a dataclass it was not given
