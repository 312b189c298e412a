"""Speculation pays or it stops: the generation batch's choice, step by step, between a
speculative step (draft, verify) and a plain one, from the tokens per second each kind of step
has been measured to give at the batch's size; and each sequence's draft cap.

A verification pass costs what its tokens cost: on a CPU about linearly in them, on a GPU
little more than one token's step. Drafts that are rejected, or a batch whose other rows are
padded to one row's long draft, make speculation slower than plain decoding, by how much
depends on the device and the model. So the batch measures both kinds, per batch-size bucket
(1, 2-3, 4-7, ...), as an exponential moving average of the tokens a step answers over the
seconds it took, runs the faster, and now and then runs a few steps of the other to keep its
rate fresh. The tokens are the same either way (engine/speculative.py); only the speed moves.

Each sequence's draft is capped as TCP opens its window: the first at FIRST_CAP tokens, a draft
wholly accepted doubles the cap (up to the drafter's own maximum), one cut short sets it to the
accepted length plus one."""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.3  # the moving average's weight of a new run
RUN_STEPS = 8  # a run of one kind is measured (and closed) after this many steps at most
EXPLORE_STEPS = 4  # steps a run of the kind not chosen lasts
# steps between two such runs: their cost, (fast / slow - 1) slow steps each, kept near
# LOSS of the steps run, and at least EXPLORE_MIN steps apart
LOSS, EXPLORE_MIN, EXPLORE_MAX = 0.02, 64, 4096
FIRST_CAP = 4  # a sequence's first draft, at most (slow start)


@dataclass
class Bucket:
    """One batch-size bucket's measured rates (tokens per second), by kind (speculative?)."""

    rates: dict[bool, float] = field(default_factory=dict)
    steps: int = 0
    trial: int = 0  # steps left of a run of the kind not chosen

    def choose(self) -> bool:
        for kind in (True, False):  # measure each kind first, speculation first
            if kind not in self.rates:
                return kind
        fast, slow = sorted(self.rates.values(), reverse=True)
        best = self.rates[True] >= self.rates[False]
        self.steps += 1
        cost = EXPLORE_STEPS * (fast / max(slow, 1e-9) - 1)
        every = min(EXPLORE_MAX, max(EXPLORE_MIN, int(cost / LOSS)))
        if self.trial == 0 and self.steps % every == 0:
            self.trial = EXPLORE_STEPS
        if self.trial:
            self.trial -= 1
            return not best
        return best

    def record(self, speculative: bool, rate: float) -> None:
        old = self.rates.get(speculative)
        self.rates[speculative] = rate if old is None else old + ALPHA * (rate - old)


@dataclass
class Run:
    bucket: int
    speculative: bool
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0


class Pacer:
    """The batch's choice of step, per batch-size bucket, measured over runs of steps of one
    kind: a plain step's forward pass runs while the engine does other work and is waited for
    by the next step, so a run that ends with a plain step is charged the wait for its last
    pass (``full`` or ``ends_run``, then ``close``)."""

    def __init__(self) -> None:
        self.buckets: dict[int, Bucket] = {}
        self.run: Run | None = None

    def choose(self, rows: int) -> bool:
        return self.buckets.setdefault(_bucket(rows), Bucket()).choose()

    def full(self) -> bool:
        """The open run is long enough to be measured."""
        return self.run is not None and self.run.steps >= RUN_STEPS

    def ends_run(self, rows: int, speculative: bool) -> bool:
        """The next step is not of the open run's bucket and kind."""
        run = self.run
        return run is not None and (run.bucket, run.speculative) != (_bucket(rows),
                                                                      speculative)

    def add(self, rows: int, speculative: bool, tokens: int, seconds: float) -> None:
        if self.run is None:
            self.run = Run(_bucket(rows), speculative)
        run = self.run
        run.steps, run.tokens, run.seconds = run.steps + 1, run.tokens + tokens, (
            run.seconds + seconds)

    def close(self, wait: float) -> None:
        """The open run ends; ``wait``: the seconds its last pass was waited for after it."""
        run, self.run = self.run, None
        if run is not None and run.seconds + wait > 0:
            self.buckets.setdefault(run.bucket, Bucket()).record(
                run.speculative, run.tokens / (run.seconds + wait))


class AlwaysSpeculate(Pacer):
    """Every step speculates (EngineConfig.spec_pace off: the tests that count drafts)."""

    def choose(self, rows: int) -> bool:
        return True


def _bucket(rows: int) -> int:
    return max(rows, 1).bit_length()


class DraftCaps:
    """Each speculating sequence's draft cap, opened and closed by what the target accepts."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self.caps: dict[int, int] = {}

    def cap(self, uid: int) -> int:
        return self.caps.get(uid, min(self.ceiling, FIRST_CAP))

    def update(self, uid: int, drafted: int, accepted: int) -> None:
        if drafted:
            full = accepted == drafted
            self.caps[uid] = min(self.ceiling, 2 * drafted) if full else accepted + 1

    def keep(self, uids: list[int]) -> None:
        for uid in set(self.caps) - set(uids):
            del self.caps[uid]
