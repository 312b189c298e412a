"""Plain data that crosses the engine boundary (and Ray calls): requests in, events out.

Nothing here knows about HTTP or llama-server's JSON; the shaper turns events into frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sampler_fields import sampler_dataclass

RANDOM_SEED = 0xFFFFFFFF

DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)


# the numeric sampler settings, one row each (engine/sampler_fields.py): SamplingParams' base
SamplerSettings = sampler_dataclass("SamplerSettings")
SamplerSettings.__module__ = __name__


@dataclass(slots=True)
class SamplingParams(SamplerSettings):
    """The sampler chain of one sequence, in llama.cpp's terms and defaults: the table's
    settings (SamplerSettings), and these."""

    dry_sequence_breakers: list[str] = field(default_factory=lambda: ["\n", ":", '"', "*"])
    min_keep: int = 0
    seed: int = RANDOM_SEED
    # (token id, bias); a bias of None bans the token (-inf).
    logit_bias: list[tuple[int, float | None]] = field(default_factory=list)
    samplers: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLERS))
    n_probs: int = 0
    post_sampling_probs: bool = False


# llama.cpp's common_grammar_trigger_type, the ``type`` of a grammar_triggers entry
TRIGGER_TOKEN, TRIGGER_WORD, TRIGGER_PATTERN, TRIGGER_PATTERN_FULL = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class GrammarTrigger:
    """What starts a lazy grammar: a sampled token id, a word in the generated text, or a regex
    over it (searched anywhere, or matching all of it for ``TRIGGER_PATTERN_FULL``)."""

    type: int
    value: str
    token: int = -1  # TRIGGER_TOKEN only


UNLIMITED_BUDGET = 2**31 - 1  # llama.cpp's INT_MAX: a budget that never runs out


@dataclass(slots=True)
class ReasoningBudget:
    """llama.cpp's reasoning-budget sampler for one sequence, tokenized: once ``start`` has been
    generated, at most ``tokens`` more are sampled freely before ``forced`` is forced one token at a
    time, unless one of ``ends`` is generated first (see engine/reasoning_budget.py)."""

    tokens: int
    start: list[int]
    ends: list[list[int]]
    forced: list[int] = field(default_factory=list)  # empty: nothing is forced
    generation_prompt: str = ""  # its tokens are accepted before the first generated one


@dataclass(slots=True)
class GenerationRequest:
    """One sequence to generate: one prompt, one completion (an n_cmpl child is its own request)."""

    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_predict: int = -1  # -1: until the context is full
    stop: list[str] = field(default_factory=list)
    grammar: str = ""  # GBNF, or Lark after "%llguidance"; "" for none
    reasoning_budget: ReasoningBudget | None = None
    grammar_prefill: str = ""  # text whose tokens the grammar accepts before generation
    grammar_lazy: bool = False  # the grammar waits for one of grammar_triggers
    grammar_triggers: list[GrammarTrigger] = field(default_factory=list)
    preserved_tokens: list[int] = field(default_factory=list)  # special tokens rendered as text
    ignore_eos: bool = False
    cache_prompt: bool = True
    n_indent: int = 0
    t_max_predict_ms: int = -1
    stream: bool = False  # per-token events are sent only to streams
    return_progress: bool = False
    timings_per_token: bool = False
    id_slot: int = -1
    index: int = 0
    child: bool = False  # an n_cmpl child: shares the prompt evaluated by the request before it
    # LoRA adapters of this sequence: (name, scale) pairs, nonzero scales, sorted by name
    adapters: tuple[tuple[str, float], ...] = ()
    tag: object = None  # the caller's own data, echoed by Engine.slot_states (e.g. the params)
    # the OpenAI answer's id, which POST /v1/chat/completions/control names (engine/control.py),
    # and whether that route may end this sequence's reasoning (the request's reasoning_control)
    completion_id: str = ""
    reasoning_control: bool = False
    replica: str | None = None  # the model replica holding id_slot (its router sends it there)


@dataclass(slots=True)
class Timings:
    """Raw figures behind the native ``timings`` object."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0  # speculative draft tokens, and how many were accepted (llama.cpp's
    draft_n_accepted: int = 0  # timings carry both when a draft was made)


@dataclass
class SpecCounters:
    """Speculative drafts, their tokens, and the tokens accepted: a sequence's, or the
    engine's for /metrics' ``llamacpp:spec_decode_*`` counters."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0

    def add(self, n_draft: int, n_accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += n_draft
        self.accepted += n_accepted


@dataclass(slots=True)
class TokenProb:
    id: int
    piece: bytes
    logprob: float  # a probability instead when post_sampling_probs


@dataclass(slots=True)
class TokenProbs:
    """Probabilities of one generated step: the sampled token and the top candidates."""

    id: int
    text: bytes  # the text actually sent for this step
    logprob: float
    top: list[TokenProb]


@dataclass(slots=True)
class StartEvent:
    """A streamed sequence got its slot (llama.cpp's start marker)."""

    index: int


@dataclass(slots=True)
class ProgressEvent:
    index: int
    total: int
    cache: int
    processed: int
    time_ms: int
    timings: Timings | None = None


@dataclass(slots=True)
class TokenEvent:
    index: int
    token: int
    text: str
    n_predicted: int
    n_prompt: int
    timings: Timings | None = None
    probs: TokenProbs | None = None
    n_cache: int = 0  # prompt tokens reused from the cache (the Messages API's message_start)


@dataclass(slots=True)
class FinalEvent:
    index: int
    id_slot: int
    content: str
    tokens: list[int]
    stop_type: str  # none, eos, limit, word
    stopping_word: str
    n_prompt: int
    n_predicted: int
    tokens_cached: int
    truncated: bool
    has_new_line: bool
    timings: Timings
    prompt: str = ""  # the prompt detokenized with special tokens
    probs: list[TokenProbs] = field(default_factory=list)


@dataclass(slots=True)
class ErrorEvent:
    """A request that failed; ``extra`` holds additional envelope keys (n_prompt_tokens, n_ctx)."""

    index: int
    code: int
    message: str
    type: str
    extra: dict = field(default_factory=dict)


EngineEvent = StartEvent | ProgressEvent | TokenEvent | FinalEvent | ErrorEvent


# llama-server runs every result through the chat parser; invalid UTF-8 fails its Content-only
# grammar (spec §5.10)
BAD_OUTPUT_MESSAGE = (
    "The model produced output that does not match the expected Content-only format"
)


class EngineError(Exception):
    """A request the engine refuses; carries what the error envelope needs."""

    def __init__(self, message: str, code: int = 400, type: str = "invalid_request_error", **extra):
        super().__init__(message)
        self.message = message
        self.code = code
        self.type = type
        self.extra = extra

    def to_event(self, index: int = 0) -> ErrorEvent:
        return ErrorEvent(index, self.code, self.message, self.type, dict(self.extra))


@dataclass(frozen=True)
class Gather:
    """How long a stream's tokens after the first gather before they leave as one batch:
    ``floor_s`` plus ``per_sequence_s`` for each sequence the engine is running, at most
    ``max_s``. A lone stream then gets a batch every few milliseconds (invisible to a reader),
    a busy engine fuller ones, and the graph's cost per token falls as the load rises. The
    batches leave on a grid of that interval shared by every stream (``aio.next_tick``).
    ``Gather()`` sends every batch as soon as it is ready (llama-server's timing)."""

    floor_s: float = 0.0
    per_sequence_s: float = 0.0
    max_s: float = 0.1

    def interval(self, n_active: int) -> float:
        return min(self.max_s, self.floor_s + self.per_sequence_s * n_active)

    @property
    def off(self) -> bool:
        return self.floor_s <= 0 and self.per_sequence_s <= 0


@dataclass
class EngineConfig:
    """The engine's settings. Their defaults are the server's: GraphArgs takes them from here
    (deployments/api/config.py), and deployments/serve/engines.py makes one from a GraphArgs."""

    n_parallel: int = 4
    n_ctx: int = 2048  # per slot
    n_batch: int = 512  # prefill chunk, and the prompt tokens one step reads in all
    prefill_waves: bool = True  # a burst of prompts read n_batch tokens a step (prefill_waves.py)
    cache_entries: int = 0  # prefix-cache entries; 0 means 2 per slot
    cache_ram_mib: int = 8192  # the prefix cache's KV bytes, in MiB (--cache-ram); -1: no limit
    max_queue: int = 256  # waiting sequences (prompts times n_cmpl) before a request is refused
    kv_cache_type: str = "f16"  # -ctk/-ctv: f32, f16, bf16 (the model's dtype), q8_0, q4_0
    cache_disk: str | None = None  # the prompt cache's disk tier: a folder (--cache-disk)
    cache_disk_mib: int = 16384  # its bound in MiB (--cache-disk-mib); -1: no limit
    # --spec-type: "ngram-simple" drafts from the context (speculative.py), "draft-simple" from
    # the draft model the engine is given (draft_model.py)
    spec_type: str = "none"
    spec_ngram_size_n: int = 12  # --spec-ngram-simple-size-n
    spec_ngram_size_m: int = 48  # --spec-ngram-simple-size-m
    spec_draft_n_max: int = 3  # --spec-draft-n-max: a draft model's tokens per draft, at most
    spec_draft_n_min: int = 0  # --spec-draft-n-min: a shorter draft is not proposed
    spec_draft_p_min: float = 0.0  # --spec-draft-p-min: a draft stops at a less likely token
    spec_pace: bool = True  # speculate only while it is measured faster (spec_pacer.py)


# llama.cpp's KV cache types (-ctk/-ctv) mlxray takes: the quantized ones with their bits (MLX's
# affine groups of 32, engine/kv_quant.py), the others the unquantized cache in the model's dtype
QUANTIZED_TYPES = {"q8_0": 8, "q4_0": 4}
UNQUANTIZED_TYPES = ("f32", "f16", "bf16")
CACHE_TYPES = (*UNQUANTIZED_TYPES, *QUANTIZED_TYPES)
