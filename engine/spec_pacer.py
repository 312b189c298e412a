"""Speculation pays or it stops: the width of the generation batch's verification pass, chosen
step by step from the tokens per second each width has been measured to give at the batch's
size, 0 being a plain step; and each sequence's draft cap.

A verification pass costs what its tokens cost, rows times width plus one: on a CPU about
linearly past a few dozen tokens, on a GPU little more than one token's step up to hundreds.
Every row is padded to the widest draft, so one sequence's long draft makes the whole batch's
pass long; and drafts that are rejected are paid for all the same. By how much that outweighs
the accepted tokens depends on the device, the model and the text. So the batch measures it:
per batch-size bucket (1, 2-3, 4-7, ...), each width cap it tried (0, 1, 2, 4, ... up to the
drafter's maximum) gets an exponential moving average of the tokens a run of its steps answered
over the seconds they took; the best cap runs, and now and then a run of a neighbouring cap
(half, double) keeps those rates fresh and climbs to a better one: often while they are close,
rarely once they are far behind. The tokens are the same at every width
(engine/speculative.py); only the speed moves.

Each sequence's draft is capped as TCP opens its window: the first at FIRST_CAP tokens, a draft
wholly accepted doubles the cap (up to the drafter's own maximum), one cut short sets it to the
accepted length plus one."""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.3  # the moving average's weight of a new run
RUN_STEPS = 16  # a run of one width is measured (and closed) after this many steps at most
EXPLORE_STEPS = 4  # steps a run of a neighbouring width lasts
# steps between two such runs: their cost, (best / theirs - 1) steps each, kept near LOSS of
# the steps run, and at least EXPLORE_MIN steps apart
LOSS, EXPLORE_MIN, EXPLORE_MAX = 0.01, 64, 4096
FIRST_CAP = 4  # a sequence's first draft, at most (slow start)


def widths(ceiling: int) -> tuple[int, ...]:
    """The width caps tried: 0 (plain), then powers of two below ``ceiling``, then it."""
    caps, w = [0], 1
    while w < ceiling:
        caps.append(w)
        w *= 2
    return (*caps, ceiling) if ceiling > 0 else (0,)


@dataclass
class Bucket:
    """One batch-size bucket's measured rates (tokens per second), by width cap."""

    caps: tuple[int, ...]
    rates: dict[int, float] = field(default_factory=dict)
    steps: int = 0
    trial: tuple[int, int] = (0, 0)  # (width, steps left) of a neighbour's run
    turn: int = 0  # which neighbour the next exploration runs

    def choose(self) -> int:
        if 0 not in self.rates:  # plain decoding is measured first
            return 0
        best = self.best()
        for near in self.neighbours(best):  # climb: an unmeasured neighbour runs first
            if near not in self.rates:
                return near
        self.steps += 1
        width, left = self.trial
        if left:
            self.trial = (width, left - 1)
            return width
        near = self.neighbours(best)
        if near:
            pick = near[self.turn % len(near)]
            cost = EXPLORE_STEPS * (self.rates[best] / max(self.rates[pick], 1e-9) - 1)
            if self.steps % min(EXPLORE_MAX, max(EXPLORE_MIN, int(cost / LOSS))) == 0:
                self.turn += 1
                self.trial = (pick, EXPLORE_STEPS - 1)
                return pick
        return best

    def best(self) -> int:
        return max(self.rates, key=self.rates.__getitem__) if self.rates else 0

    def neighbours(self, width: int) -> list[int]:
        i = self.caps.index(width)
        return [self.caps[j] for j in (i - 1, i + 1) if 0 <= j < len(self.caps)]

    def record(self, width: int, rate: float) -> None:
        old = self.rates.get(width)
        self.rates[width] = rate if old is None else old + ALPHA * (rate - old)


@dataclass
class Run:
    bucket: int
    width: int
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0


class Pacer:
    """The batch's verification width, per batch-size bucket, measured over runs of steps of
    one width: a plain step's forward pass runs while the engine does other work and is waited
    for by the next step, so a run that ends with a plain step is charged the wait for its last
    pass (``full`` or ``ends_run``, then ``close``)."""

    def __init__(self, ceiling: int) -> None:
        self.caps = widths(ceiling)
        self.buckets: dict[int, Bucket] = {}
        self.run: Run | None = None

    def choose(self, rows: int) -> int:
        """The width cap of the next step: 0 for a plain one."""
        return self._bucket(rows).choose()

    def full(self) -> bool:
        """The open run is long enough to be measured."""
        return self.run is not None and self.run.steps >= RUN_STEPS

    def ends_run(self, rows: int, width: int) -> bool:
        """The next step is not of the open run's bucket and width."""
        run = self.run
        return run is not None and (run.bucket, run.width) != (_bucket(rows), width)

    def add(self, rows: int, width: int, tokens: int, seconds: float) -> None:
        if self.run is None:
            self.run = Run(_bucket(rows), width)
        run = self.run
        run.steps, run.tokens, run.seconds = run.steps + 1, run.tokens + tokens, (
            run.seconds + seconds)

    def close(self, wait: float) -> None:
        """The open run ends; ``wait``: the seconds its last pass was waited for after it."""
        run, self.run = self.run, None
        if run is not None and run.seconds + wait > 0:
            self.buckets.setdefault(run.bucket, Bucket(self.caps)).record(
                run.width, run.tokens / (run.seconds + wait))

    def _bucket(self, rows: int) -> Bucket:
        return self.buckets.setdefault(_bucket(rows), Bucket(self.caps))


class AlwaysSpeculate(Pacer):
    """Every step speculates at the drafter's full width (EngineConfig.spec_pace off: as
    llama-server does, and the tests that count drafts)."""

    def choose(self, rows: int) -> int:
        return self.caps[-1]


def _bucket(rows: int) -> int:
    return max(rows, 1).bit_length()


class DraftCaps:
    """Each speculating sequence's draft cap, opened and closed by what the target accepts
    (``adaptive``; else always the drafter's maximum, as llama-server drafts)."""

    def __init__(self, ceiling: int, adaptive: bool = True) -> None:
        self.ceiling = ceiling
        self.adaptive = adaptive
        self.caps: dict[int, int] = {}

    def cap(self, uid: int) -> int:
        return self.caps.get(uid, min(self.ceiling, FIRST_CAP if self.adaptive else
                                      self.ceiling))

    def update(self, uid: int, drafted: int, accepted: int) -> None:
        if drafted and self.adaptive:
            full = accepted == drafted
            self.caps[uid] = min(self.ceiling, 2 * drafted) if full else accepted + 1

    def keep(self, uids: list[int]) -> None:
        for uid in set(self.caps) - set(uids):
            del self.caps[uid]
