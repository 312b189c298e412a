"""engine/spec_pacer.py: the generation batch speculates while speculation is measured faster,
explores the other kind less often the further behind it is, and caps each sequence's draft by
what the target accepted (slow start, doubling, cut)."""

from __future__ import annotations

from engine.spec_pacer import EXPLORE_STEPS, FIRST_CAP, RUN_STEPS, DraftCaps, Pacer


def drive(pacer: Pacer, rows: int, rates: dict[bool, float], steps: int) -> list[bool]:
    """The kinds the pacer chose over ``steps`` steps whose speed by kind is ``rates``
    (tokens per second; each step answers ``rows`` tokens)."""
    chosen = []
    for _ in range(steps):
        if pacer.full():
            pacer.close(0.0)
        kind = pacer.choose(rows)
        if pacer.ends_run(rows, kind):
            pacer.close(0.0)
        pacer.add(rows, kind, rows, rows / rates[kind])
        chosen.append(kind)
    return chosen


def test_speculation_is_measured_first_then_the_faster_kind_runs():
    chosen = drive(Pacer(), 1, {True: 200.0, False: 100.0}, 400)
    assert chosen[:RUN_STEPS] == [True] * RUN_STEPS  # measured first
    assert chosen[RUN_STEPS:2 * RUN_STEPS] == [False] * RUN_STEPS  # then plain is
    assert chosen[2 * RUN_STEPS:].count(False) <= 400 // 64 * EXPLORE_STEPS  # then explored
    assert chosen[2 * RUN_STEPS:].count(False) >= EXPLORE_STEPS  # but still explored


def test_slow_speculation_stops_and_is_explored_rarely():
    close = drive(Pacer(), 16, {True: 90.0, False: 100.0}, 4000)
    far = drive(Pacer(), 16, {True: 20.0, False: 100.0}, 4000)
    for chosen in (close, far):
        assert chosen[-RUN_STEPS:] == [False] * RUN_STEPS
    explored = [chosen[2 * RUN_STEPS:].count(True) for chosen in (close, far)]
    assert 0 < explored[1] < explored[0]
    # the exploration of a kind five times slower costs about 2 % of the time, not more
    assert explored[1] * (100.0 / 20.0 - 1) / 4000 < 0.03


def test_each_batch_size_is_measured_apart():
    pacer = Pacer()
    drive(pacer, 1, {True: 200.0, False: 100.0}, 200)
    drive(pacer, 16, {True: 50.0, False: 100.0}, 200)
    assert pacer.choose(1) is True
    assert pacer.choose(16) is False


def test_a_plain_run_is_charged_the_wait_for_its_last_pass():
    pacer = Pacer()
    for _ in range(RUN_STEPS):  # speculation: 100 tokens/s
        pacer.add(1, True, 1, 0.01)
    pacer.close(0.0)
    for _ in range(RUN_STEPS):  # plain steps that look free, their passes waited for after
        pacer.add(1, False, 1, 0.0001)
    pacer.close(RUN_STEPS * 0.02)
    rates = pacer.buckets[1].rates
    assert rates[False] < rates[True]


def test_draft_caps_open_and_close_with_what_is_accepted():
    caps = DraftCaps(ceiling=48)
    assert caps.cap(7) == FIRST_CAP
    caps.update(7, FIRST_CAP, FIRST_CAP)
    assert caps.cap(7) == 2 * FIRST_CAP
    for _ in range(10):
        caps.update(7, caps.cap(7), caps.cap(7))
    assert caps.cap(7) == 48
    caps.update(7, 48, 5)
    assert caps.cap(7) == 6
    caps.update(7, 0, 0)  # no draft: unchanged
    assert caps.cap(7) == 6
    caps.keep([8])
    assert caps.cap(7) == FIRST_CAP
    assert DraftCaps(ceiling=3).cap(1) == 3
