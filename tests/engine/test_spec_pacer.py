"""engine/spec_pacer.py: the generation batch climbs to the verification width measured fastest
at its size (plain when speculation does not pay), explores a neighbouring width less often the
further behind it is, and caps each sequence's draft by what the target accepted (slow start,
doubling, cut)."""

from __future__ import annotations

from engine.spec_pacer import RUN_STEPS, AlwaysSpeculate, DraftCaps, Pacer, widths


def drive(pacer: Pacer, rows: int, rate, steps: int) -> list[int]:
    """The widths the pacer chose over ``steps`` steps, each answering ``rows`` tokens at
    ``rate(width)`` tokens per second."""
    chosen = []
    for _ in range(steps):
        if pacer.full():
            pacer.close(0.0)
        width = pacer.choose(rows)
        if pacer.ends_run(rows, width):
            pacer.close(0.0)
        pacer.add(rows, width, rows, rows / rate(width))
        chosen.append(width)
    return chosen


def test_the_widths_tried():
    assert widths(48) == (0, 1, 2, 4, 8, 16, 32, 48)
    assert widths(3) == (0, 1, 2, 3)
    assert widths(1) == (0, 1)


def test_it_climbs_to_the_fastest_width_and_stays_there():
    peak = {0: 100.0, 1: 130.0, 2: 160.0, 4: 200.0, 8: 150.0, 16: 90.0, 32: 50.0, 48: 40.0}
    chosen = drive(Pacer(48), 1, peak.__getitem__, 2000)
    assert chosen[:RUN_STEPS] == [0] * RUN_STEPS  # plain is measured first
    assert set(chosen[:8 * RUN_STEPS]) == {0, 1, 2, 4, 8}  # then up, one neighbour at a time
    assert 16 not in chosen  # past the peak's neighbour nothing is tried
    assert chosen[-200:].count(4) > 0.8 * 200  # the rest: its neighbours, explored


def test_speculation_that_never_pays_stays_off_and_is_explored_rarely():
    costs = []
    for slow in (90.0, 20.0):
        chosen = drive(Pacer(48), 16, lambda w, s=slow: 100.0 if w == 0 else s, 4000)
        assert chosen[-400:].count(0) > 0.9 * 400
        tried = sum(1 for w in chosen[RUN_STEPS:] if w)
        costs.append((tried, tried * (100.0 / slow - 1) / 4000))
    (close, _), (far, far_cost) = costs
    assert 0 < far < close  # the further behind, the rarer
    assert far_cost < 0.03  # exploring a width five times slower costs about 2 % of the time


def test_each_batch_size_is_measured_apart():
    pacer = Pacer(8)
    drive(pacer, 1, lambda w: 100.0 + 10 * w, 400)
    drive(pacer, 16, lambda w: 100.0 - 10 * w, 400)
    assert pacer.buckets[1].best() == 8
    assert pacer.buckets[5].best() == 0


def test_a_plain_run_is_charged_the_wait_for_its_last_pass():
    pacer = Pacer(4)
    for _ in range(RUN_STEPS):  # plain steps that look free, their passes waited for after
        pacer.add(1, 0, 1, 0.0001)
    pacer.close(RUN_STEPS * 0.02)
    for _ in range(RUN_STEPS):  # speculation at 100 tokens/s
        pacer.add(1, 1, 1, 0.01)
    pacer.close(0.0)
    assert pacer.buckets[1].best() == 1


def test_without_pacing_every_step_speculates_at_full_width():
    assert drive(AlwaysSpeculate(8), 4, lambda w: 100.0 - w, 50) == [8] * 50


def test_draft_caps_open_and_close_with_what_is_accepted():
    caps = DraftCaps(ceiling=48)
    assert caps.cap(7) == 4
    caps.update(7, 4, 4)
    assert caps.cap(7) == 8
    for _ in range(10):
        caps.update(7, caps.cap(7), caps.cap(7))
    assert caps.cap(7) == 48
    caps.update(7, 48, 5)
    assert caps.cap(7) == 6
    caps.update(7, 0, 0)  # no draft: unchanged
    assert caps.cap(7) == 6
    caps.keep([8])
    assert caps.cap(7) == 4
    assert DraftCaps(ceiling=3).cap(1) == 3
    fixed = DraftCaps(ceiling=48, adaptive=False)
    fixed.update(1, 48, 0)
    assert fixed.cap(1) == 48
