"""The engine's bookkeeping: slots, the tasks (sequences) they run, the groups of one client
request, and llama.cpp's server metrics. Only the scheduler thread changes them."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .adapter_folder import BASE_KEY
from .text import TextState
from .types import (
    EngineConfig,
    EngineEvent,
    GenerationRequest,
    SpecCounters,
    Timings,
    TokenProbs,
)

if TYPE_CHECKING:
    from .grammar import GrammarProcessor
    from .reasoning_budget import BudgetState

Sink = Callable[[list[EngineEvent]], None]

__all__ = ["EngineConfig", "EngineMetrics", "Group", "Sink", "Slot", "Task", "units"]


@dataclass
class Slot:
    id: int
    task: Task | None = None
    last_used: float = 0.0
    last_tokens: list[int] = field(default_factory=list)
    cache_key: str = BASE_KEY  # the prefix cache's key of last_tokens (its LoRA adapters)
    n_prompt_processed: int = 0
    last: Task | None = None  # the task it ran last, kept for /slots


@dataclass
class Task:
    req: GenerationRequest
    group: Group
    text: TextState
    seed: int
    slot: Slot | None = None
    grammar: GrammarProcessor | None = None
    uid: int = -1
    n_prompt: int = 0
    n_cache: int = 0
    n_gen: int = 0
    tokens: list[int] = field(default_factory=list)
    snapshots: list[int] = field(default_factory=list)  # prompt positions whose cache is kept
    probs: list[TokenProbs] = field(default_factory=list)
    # what the sampling chain recorded for the tokens in flight, oldest first: the raw logits
    # (pre-sampling probabilities) or the candidates' probabilities after the draw
    recorded: deque = field(default_factory=deque)
    spec: SpecCounters = field(default_factory=SpecCounters)  # its speculative drafts
    t_start: float = 0.0
    t_prompt: float = 0.0
    t_first: float = 0.0
    t_last: float = 0.0
    stop_type: str | None = None
    truncated: bool = False
    # n_cmpl: a child runs on a copy of its parent's evaluated prompt and reports its timings
    parent: Task | None = None
    children: list[Task] = field(default_factory=list)
    id: int = -1
    fault: Exception | None = None  # raised by this sequence's sampler or logits processors
    budget: BudgetState | None = None  # the reasoning budget's state, which control may force

    def timings(self) -> Timings:
        predicted_ms = max(1e-3, (self.t_last - self.t_first) * 1e3) if self.n_gen else 0.0
        src = self.parent or self
        return Timings(
            cache_n=src.n_cache,
            prompt_n=src.n_prompt - src.n_cache,
            prompt_ms=max(0.0, (src.t_prompt - src.t_start) * 1e3) if src.t_prompt else 0.0,
            predicted_n=self.n_gen,
            predicted_ms=predicted_ms,
            draft_n=self.spec.draft_tokens,
            draft_n_accepted=self.spec.accepted,
        )


@dataclass
class Group:
    """The sequences of one client request (several prompts, n_cmpl children): admitted together,
    cancelled together, delivered through one sink."""

    id: int
    tasks: list[Task]
    sink: Sink
    pending: list[EngineEvent] = field(default_factory=list)
    cancelled: bool = False


def units(tasks: list[Task]) -> list[list[Task]]:
    """Split a request into admission units: each prompt with the n_cmpl children that follow it.

    The reference needs n_cmpl free slots at once for a prompt's completions, while the prompts of
    one request are independent tasks: a request may hold more prompts than there are slots.
    """
    units: list[list[Task]] = []
    for task in tasks:
        if task.req.child and units:
            units[-1].append(task)
        else:
            units.append([task])
    return units


# the totals a snapshot carries that only grow (n_tokens_max: the largest seen): what a model of
# several replicas sums for /metrics (deployments/serve/status.py)
OWN_COUNTERS = ("prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
                "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total",
                "n_busy_slots_total", "n_tokens_max", "cache_disk_hits_total",
                "prompt_tokens_cache_disk_total")
SPEC_COUNTERS = {"spec_decode_num_drafts_total": "drafts",  # of EngineMetrics.spec
                 "spec_decode_num_draft_tokens_total": "draft_tokens",
                 "spec_decode_num_accepted_tokens_total": "accepted"}
COUNTERS = (*OWN_COUNTERS, *SPEC_COUNTERS)
BUCKET = ("bucket_prompt_tokens", "bucket_prompt_seconds", "bucket_predicted_tokens",
          "bucket_predicted_seconds")


@dataclass
class EngineMetrics:
    """llama.cpp's server metrics: totals since start, and a bucket reset at each snapshot that
    gives the throughput gauges."""

    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    n_tokens_max: int = 0
    bucket_prompt_tokens: int = 0
    bucket_prompt_seconds: float = 0.0
    bucket_predicted_tokens: int = 0
    bucket_predicted_seconds: float = 0.0
    cache_disk_hits_total: int = 0  # prompts whose cache was read from the disk tier
    prompt_tokens_cache_disk_total: int = 0  # the prompt tokens those read
    spec: SpecCounters = field(default_factory=SpecCounters)  # speculative decoding's

    def on_disk_hit(self, n_tokens: int) -> None:
        self.cache_disk_hits_total += 1
        self.prompt_tokens_cache_disk_total += n_tokens

    def on_decode(self, n_busy: int) -> None:
        self.n_decode_total += 1
        self.n_busy_slots_total += n_busy

    def on_retire(self, n_prompt: int, n_cached: int, prompt_ms: float, n_predicted: int,
                  predicted_s: float, n_tokens: int) -> None:
        self.prompt_tokens_total += n_prompt
        self.prompt_tokens_cached_total += n_cached
        self.prompt_seconds_total += prompt_ms / 1e3
        self.tokens_predicted_total += n_predicted
        self.tokens_predicted_seconds_total += predicted_s
        self.n_tokens_max = max(self.n_tokens_max, n_tokens)
        self.bucket_prompt_tokens += n_prompt
        self.bucket_prompt_seconds += prompt_ms / 1e3
        self.bucket_predicted_tokens += n_predicted
        self.bucket_predicted_seconds += predicted_s

    def snapshot(self, n_processing: int, n_deferred: int, reset_bucket: bool) -> dict:
        out = {k: getattr(self, k) for k in OWN_COUNTERS + BUCKET}
        out.update({k: getattr(self.spec, name) for k, name in SPEC_COUNTERS.items()},
                   n_processing=n_processing, n_deferred=n_deferred)
        if reset_bucket:
            self.bucket_prompt_tokens = self.bucket_predicted_tokens = 0
            self.bucket_prompt_seconds = self.bucket_predicted_seconds = 0.0
        return out
