"""The graph's arguments (the ``args`` of a configs/*.yaml application), validated by pydantic so a
typo in a config fails at start with a clear message."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deployments.api import cors
from deployments.api.chat_template import CHATML
from deployments.api.defaults import check_sampling
from deployments.api.field_parsers import REASONING_FORMATS
from deployments.api.json_values import INT32_MAX
from deployments.api.models_folder import find_models
from engine.adapter_folder import AdapterError, adapter_kind
from engine.device_choice import DEVICE_PATTERN
from engine.gguf import is_gguf
from engine.types import EngineConfig, Gather


class Handle(Protocol):
    """A Ray Serve deployment handle, as far as the graph's arguments use one."""

    def options(self, **kwargs: Any) -> Handle: ...


REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = str(REPO_ROOT / "models" / "tiny-python")
ENGINE = EngineConfig()  # the engine's settings' defaults, written once (engine/types.py)
# The default gather of stream tokens after the first (docs/performance.md has the A/B).
PER_SEQUENCE_MS = 4.0
MAX_INTERVAL_MS = 50.0
# Settings of the whole application (the ingress's), never of one model: a ``models`` entry
# may not set them, as llama-server's router keeps its API key from its model presets.
APP_WIDE = ("api_key", "api_key_file", "max_body_bytes", "webui", "static_path", "predict_route",
            "health_route", "cors_origins", "cors_methods", "cors_headers", "cors_credentials")
# Calls other than generation (readiness, model info, slots) that must get through a full queue.
CONTROL_HEADROOM = 16


def local_path(model: str) -> str:
    """A local folder or GGUF file, relative to the working directory or to the repository,
    else ``model`` as given (a hub id)."""
    for candidate in (Path(model), REPO_ROOT / model):
        if candidate.is_dir() or (is_gguf(candidate) and candidate.is_file()):
            return str(candidate.resolve())
    return model


class GraphArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(DEFAULT_MODEL, description="local model folder, a GGUF file (llama.cpp's "
                                                  "format: engine/gguf), or a Hugging Face id")
    device: str = Field("auto", pattern=DEVICE_PATTERN,
                        description="where the model runs: auto (the GPU where MLX has one: Metal "
                                    "on a Mac, CUDA with MLX's CUDA backend; else the CPU), gpu, "
                                    "gpu:N or cpu (llama-server -dev)")
    alias: str | None = Field(None, description="model name in responses (llama-server --alias)")
    chat_template_file: str | None = Field(
        None, description="a Jinja chat template file used instead of the model's own "
                          "(llama-server --chat-template-file); relative to the working "
                          "directory or the repository")
    config_overrides: dict[str, Any] = Field(
        {}, description="keys laid over the model folder's config.json when it loads "
                        "(mlx_lm.load's model_config): rope_theta, rope_scaling, ... "
                        "(llama-server --rope-*, --yarn-*); not for a GGUF file")
    chat_template: str | None = Field(
        None, description="a Jinja chat template's text used instead of the model's own "
                          "(llama-server --chat-template; the name chatml is ChatML)")
    chat_template_kwargs: dict[str, Any] = Field(
        {}, description="default variables of the chat template, under a request's own "
                        "chat_template_kwargs (llama-server --chat-template-kwargs)")
    n_parallel: int = Field(ENGINE.n_parallel, ge=1, le=256, description="slots (llama-server -np)")
    n_ctx: int = Field(ENGINE.n_ctx, ge=8, description="context tokens per slot")
    n_batch: int = Field(ENGINE.n_batch, ge=1,
                         description="prefill chunk in tokens (llama-server -b)")
    n_predict: int = Field(-1, ge=-1, description="default token limit (llama-server -n)")
    batch_size: int = Field(2048, ge=1, description="llama-server -b, the logical batch: "
                            "/infill's prefix and suffix budgets read it")
    spm_infill: bool = Field(False, description="/infill's Suffix/Prefix/Middle order "
                             "(--spm-infill)")
    temperature: float = Field(0.8, description="default temperature (--temp; <= 0: greedy)")
    seed: int = Field(0xFFFFFFFF, ge=0, le=0xFFFFFFFF, description="default seed (--seed)")
    sampling: dict[str, Any] = Field(
        {}, description="defaults of a request's other sampling fields, by the field's name "
                        "(top_k, top_p, min_p, typical_p, repeat_penalty, dry_multiplier, "
                        "samplers, ignore_eos, ...: llama-server --top-k, --top-p, ...); a "
                        "request's own field overrides its default")
    cache_prompt: bool = Field(True, description="default of cache_prompt")
    reasoning_format: str = Field(
        "deepseek", description="default of a request's reasoning_format (--reasoning-format): "
                                "none, auto, deepseek or deepseek-legacy")
    reasoning_budget_tokens: int = Field(
        -1, ge=-1, le=INT32_MAX,
        description="default of a request's reasoning_budget_tokens (--reasoning-budget): "
                    "-1 no budget, 0 end at once, N tokens")
    kv_cache_type: Literal["f32", "f16", "bf16", "q8_0", "q4_0"] = Field(
        ENGINE.kv_cache_type,
        description="the KV cache (-ctk/-ctv): q8_0, q4_0 quantized (groups of 32); "
                    "f32, f16, bf16 unquantized, in the model's dtype")
    cache_entries: int = Field(
        ENGINE.cache_entries, ge=0,
        description="prefix-cache entries, prompt snapshots included; 0: two per slot")
    cache_ram_mib: int = Field(
        ENGINE.cache_ram_mib, ge=-1,
        description="the prefix cache's KV arrays in MiB (-cram, --cache-ram): least recently "
                    "used entries are evicted past it; -1 no limit, 0 no prefix cache")
    cache_disk: str | None = Field(
        ENGINE.cache_disk,
        description="a folder for the prompt cache's disk tier (--cache-disk): entries leaving "
                    "RAM, and long prompts' as soon as they are made, are kept there, keyed "
                    "by their tokens and by the model, adapter, KV-cache type and mlxray "
                    "version; a prompt that misses RAM loads its longest prefix found there; "
                    "a restarted server and every replica of the node share it")
    cache_disk_mib: int = Field(
        ENGINE.cache_disk_mib, ge=-1,
        description="the disk tier's bound in MiB (--cache-disk-mib): least recently used "
                    "files are removed past it; -1 no limit")
    spec_type: Literal["none", "ngram-simple", "draft-simple"] = Field(
        ENGINE.spec_type,
        description="speculative decoding (--spec-type): ngram-simple drafts each sequence's "
                    "next tokens from its own context, draft-simple from model_draft's model; "
                    "every draft is verified in one batched pass (greedy and batched-draw "
                    "sampled sequences)")
    model_draft: str | None = Field(
        None, description="the draft model of draft-simple (-md): a folder or GGUF file with "
                          "the model's vocabulary")
    spec_draft_n_max: int = Field(
        ENGINE.spec_draft_n_max, ge=0,
        description="draft-simple's tokens per draft, at most (--spec-draft-n-max)")
    spec_draft_n_min: int = Field(
        ENGINE.spec_draft_n_min,
        description="draft-simple's shortest draft proposed (--spec-draft-n-min)")
    spec_draft_p_min: float = Field(
        ENGINE.spec_draft_p_min,
        description="draft-simple stops at a token less likely than this among the draft's "
                    "10 best (--spec-draft-p-min)")
    spec_pace: bool = Field(
        ENGINE.spec_pace,
        description="speculate only while speculative steps are measured faster than plain "
                    "ones at the batch's size (engine/spec_pacer.py); off (--no-spec-pace): "
                    "every step that can, as llama-server does")
    spec_ngram_size_n: int = Field(
        ENGINE.spec_ngram_size_n, ge=1, le=1024,
        description="ngram-simple's lookup n-gram (--spec-ngram-simple-size-n)")
    spec_ngram_size_m: int = Field(
        ENGINE.spec_ngram_size_m, ge=1, le=1024,
        description="ngram-simple's draft length at most (--spec-ngram-simple-size-m)")
    stream_interval_ms: float = Field(
        0.0, ge=0.0, le=1000.0,
        description="streams: after the first token, gather tokens for this long per item, "
                    "on a grid all streams share (fewer Ray round trips per token; the first "
                    "token is never held)")
    stream_interval_per_sequence_ms: float = Field(
        PER_SEQUENCE_MS, ge=0.0, le=1000.0,
        description="streams: gather this much longer for each sequence the engine is running "
                    "(0 with stream_interval_ms 0: every token leaves at once, as llama-server)")
    stream_interval_max_ms: float = Field(
        MAX_INTERVAL_MS, ge=0.0, le=1000.0,
        description="streams: the longest gather interval (a stream's first wait after its "
                    "first token reaches the grid: half an interval to one and a half)")
    handle_transport: Literal["grpc", "ray"] = Field(
        "grpc", description="how the ingress, the response shapers and the model replicas "
                            "call each other: grpc (Ray Serve's inter-deployment gRPC, "
                            "arguments and stream items by value: about a third less CPU per "
                            "token, docs/performance.md) or ray (Ray object references, Serve's "
                            "default); the status board's reports stay on object references")
    stream_channel: Literal["shared", "per_request"] = Field(
        "shared", description="how stream items travel from a model replica to a shaper and "
                              "from a shaper to the ingress: shared (one connection per pair "
                              "of processes carries every request's items, each request still "
                              "one routed Ray Serve call per hop; deployments/serve/channel.py; "
                              "per_request when Ray runs with TLS) or per_request (each "
                              "request's items are its own Ray Serve stream)")
    max_queue: int = Field(ENGINE.max_queue, ge=0,
                           description="queued sequences (prompts times n_cmpl) before 503")
    metrics: bool = Field(False, description="serve /metrics (--metrics)")
    slots: bool = Field(True, description="serve /slots (--slots)")
    props: bool = Field(False, description="allow POST /props (--props)")
    api_key: str | None = Field(None, description="required key (--api-key)")
    api_key_file: str | None = Field(
        None, description="file of keys, one per line, # comments (--api-key-file); read by "
                          "the ingress at start, so the keys stay out of the serve config")
    slot_save_path: str | None = Field(
        None, description="folder for POST /slots/{id}?action=save|restore (--slot-save-path)")
    embeddings: bool = Field(False, description="serve the embedding routes (--embedding)")
    pooling: Literal["none", "mean", "cls", "last"] = Field(
        "none", description="embedding pooling (--pooling); none: the model's default here")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest request body")
    webui: bool = Field(True, description="serve the web page at / (--webui / --no-webui)")
    static_path: str | None = Field(
        None, description="folder of static files served at / instead of the built-in page "
                          "(--path); index.html at /; off with webui: false, as the reference")
    predict_route: str | None = Field(
        None, pattern=r"^/", description="Vertex AI's predict route (AIP_MODE=PREDICTION: "
                                         "AIP_PREDICT_ROUTE, /predict unset)")
    health_route: str | None = Field(
        None, pattern=r"^/", description="Vertex AI's health route, /health's twin "
                                         "(AIP_HEALTH_ROUTE)")
    adapters: tuple[str | dict[str, Any], ...] = Field(
        (), description="mlx-lm adapter folders loaded at start (--lora, --lora-scaled): a path, "
                        "or {path, scale (1.0), name (the folder's name)}; LoRA adapters are "
                        "applied per request (ids 0, 1, ... in this order), DoRA and full "
                        "fine-tunes are fused into a model of their own, named by the adapter")
    lora_init_without_apply: bool = Field(
        False, description="adapters start at scale 0 until POST /lora-adapters sets one "
                           "(--lora-init-without-apply)")
    lora_dir: str | None = Field(
        None, description="a folder of LoRA adapter folders loaded on demand: a request whose "
                          "`model` is one's folder name uses it (Ray Serve model multiplexing)")
    max_adapters_per_replica: int = Field(
        8, ge=1, description="on-demand adapters a replica holds; the least recently used is "
                             "unloaded past it")
    adapter: str | None = Field(
        None, description="a DoRA or full fine-tune folder fused into the weights (an `adapters` "
                          "entry of those kinds becomes such a model)")
    shards: int = Field(1, ge=1, le=64,
                        description="ranks one model replica is split over (Ray actors placed by "
                                    "a placement group, MLX's ring backend between them): 1 is "
                                    "one process holding the whole model")
    shard_mode: Literal["pipeline", "tensor"] = Field(
        "pipeline", description="how a sharded model is split: pipeline (whole layers per rank, "
                                "llama-server -sm layer) or tensor (every layer's heads, -sm row)")
    cors_origins: str = Field(cors.DEFAULT_ORIGINS, description="llama-server --cors-origins: "
                              "allowed origins (* echoes the request's Origin while credentials "
                              "are allowed; localhost echoes a loopback origin only)")
    cors_methods: str = Field(cors.DEFAULT_METHODS, description="--cors-methods: a preflight's "
                              "Access-Control-Allow-Methods")
    cors_headers: str = Field(cors.DEFAULT_HEADERS, description="--cors-headers: a preflight's "
                              "Access-Control-Allow-Headers")
    cors_credentials: bool = Field(True, description="--cors-credentials: a preflight's "
                                   "Access-Control-Allow-Credentials")
    models_dir: str | None = Field(
        None, description="the folder `models` was found in (mlxray --models-dir, llama-server's "
                          "router mode): /models then answers as the reference's router")
    models_preset: str | None = Field(
        None, description="the preset file `models` was read from (mlxray --models-preset, "
                          "llama-server's INI of per-model settings): router mode as with "
                          "models_dir")
    aliases: tuple[str, ...] = Field((), description="router mode: other names the model answers "
                                     "to (a preset's alias, comma-separated)")
    tags: tuple[str, ...] = Field((), description="the model's tags (llama-server --tags): GET "
                                  "/models shows them, nothing routes by them")
    load_on_startup: bool = Field(False, description="router mode: load this model when the "
                                  "application starts (a preset's load-on-startup)")
    model_source: Literal["models_dir", "preset"] = Field(
        "models_dir", description="router mode: where the model was found (GET /models' source)")
    models_max: int = Field(4, ge=0, description="router mode: models loaded at once, the least "
                                                "recently used idle one unloaded past it (0: any)")
    models_autoload: bool = Field(True, description="router mode: a request loads its model")
    sleep_idle_seconds: int = Field(-1, ge=-1, description="unload the model after this long "
                                    "without a request, load it on the next (-1: never)")
    models: tuple[dict[str, Any], ...] = Field(
        (), description="several models in one application: each entry sets one model's keys "
                        "(model, alias, n_parallel, n_ctx, ...) over the ones above; a request's "
                        "`model` picks one by name, the first answers requests that name none")

    @field_validator("sleep_idle_seconds")
    @classmethod
    def _sleep_not_zero(cls, seconds: int) -> int:
        if seconds == 0:
            raise ValueError("invalid value: cannot be 0 or less than -1")
        return seconds

    @field_validator("reasoning_format")
    @classmethod
    def _known_reasoning_format(cls, name: str) -> str:
        if name not in REASONING_FORMATS:  # the request field's own error
            raise ValueError(f"Unknown reasoning format: {name}")
        return name

    @field_validator("sampling")
    @classmethod
    def _known_sampling(cls, sampling: dict[str, Any]) -> dict[str, Any]:
        return check_sampling(sampling)

    @model_validator(mode="before")
    @classmethod
    def _models_of_the_folder(cls, data: Any) -> Any:
        """A config that names ``models_dir`` and no ``models`` serves every model of the folder
        (as ``mlxray --models-dir`` does); a ``models_preset`` needs the command to read it."""
        if not isinstance(data, dict) or data.get("models") is not None:
            return data
        if data.get("models_preset") is not None:
            raise ValueError("models_preset: a config gets its models from the command: write it "
                             "with mlxray --models-preset FILE --dump-config")
        if data.get("models_dir") is None:
            return data
        found = find_models(data["models_dir"])
        if not found:
            raise ValueError(f"models_dir {data['models_dir']}: no model found")
        models = [{"model": str(path.absolute()), "alias": name} for name, path in found]
        return {**data, "model": data.get("model", models[0]["model"]), "models": models}

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> GraphArgs:
        looks_local = Path(self.model).is_absolute() or self.model.startswith(".")
        pending = (info.context or {}).get("model_pending")  # -mu with --dump-config
        if is_gguf(self.model) and not pending and not Path(self.model_path).is_file():
            raise ValueError(f"GGUF file not found: {self.model}")
        if looks_local and not is_gguf(self.model) and not Path(self.model_path).is_dir():
            raise ValueError(f"model folder not found: {self.model}")
        if self.config_overrides and is_gguf(self.model):
            raise ValueError("config_overrides (--rope-*, --yarn-*) applies to a model folder's "
                             "config.json, not to a GGUF file")
        if self.chat_template_file is not None and self.template_file_text() is None:
            raise ValueError(f"chat template file not found: {self.chat_template_file}")
        if self.lora_dir is not None and not Path(self.lora_dir).is_dir():
            raise ValueError(f"lora_dir folder not found: {self.lora_dir}")
        self.adapter_specs()
        self.model_configs()
        self._check_shards()
        self._check_draft()
        return self

    def _check_draft(self) -> None:
        """draft-simple has a draft model, found where -m's model would be."""
        if self.spec_type == "draft-simple" and self.model_draft is None:
            raise ValueError("--spec-type draft-simple needs a draft model (-md)")
        if self.model_draft is not None and self.spec_type != "draft-simple":
            raise ValueError("-md's draft model drafts with --spec-type draft-simple, not "
                             f"{self.spec_type}")
        if self.model_draft is not None and not Path(self.draft_path).exists():
            raise ValueError(f"draft model not found: {self.model_draft}")
        if self.model_draft is not None and self.shards > 1:
            raise ValueError("a sharded model does not speculate with a draft model")

    def _check_shards(self) -> None:
        """What a sharded replica cannot do: its ranks take decisions in lockstep only from the
        request stream (engine/lockstep.py)."""
        if self.shards == 1:
            return
        if is_gguf(self.model):
            raise ValueError("shards: a GGUF file cannot be loaded sharded (use a model folder)")
        if self.adapters or self.adapter or self.lora_dir:
            raise ValueError("shards: adapters are not supported on a sharded replica")
        if self.config_overrides:
            raise ValueError("shards: config_overrides (--rope-*, --yarn-*) are not supported "
                             "on a sharded replica")
        if self.cache_disk:
            raise ValueError("shards: cache_disk (--cache-disk) is not supported on a sharded "
                             "replica (each rank holds its own part of every KV cache)")

    def adapter_specs(self) -> tuple[AdapterSpec, ...]:
        """The ``adapters`` entries, each with its name, path, scale and kind."""
        specs = []
        for entry in self.adapters:
            entry = {"path": entry} if isinstance(entry, str) else dict(entry)
            unknown = sorted(set(entry) - {"path", "scale", "name"})
            if unknown or not isinstance(entry.get("path"), str):
                raise ValueError(f"adapters: {entry}: an adapter is a path or {{path, scale, "
                                 f"name}}" + (f" (unknown: {', '.join(unknown)})" if unknown
                                              else ""))
            given = entry["path"]
            path = next((str(c.resolve()) for c in (Path(given), REPO_ROOT / given)
                         if c.is_dir()), given)
            try:
                kind = adapter_kind(path)
            except AdapterError as exc:
                raise ValueError(f"adapters: {exc}") from None
            name = entry.get("name") or Path(path).name
            specs.append(AdapterSpec(str(name), path, float(entry.get("scale", 1.0)), kind,
                                     given))
        return tuple(specs)

    def lora_specs(self) -> tuple[AdapterSpec, ...]:
        """The LoRA adapters, in their order (their ids)."""
        return tuple(s for s in self.adapter_specs() if s.kind == "lora")

    def model_configs(self) -> tuple[GraphArgs, ...]:
        """One GraphArgs per model the application serves, the default (first) one first: this
        one alone, or each ``models`` entry over the keys set here."""
        if self.models:
            shared = self.model_dump(exclude={"models"}, exclude_unset=True)
            configs = tuple(_model_entry(i, entry, shared) for i, entry in enumerate(self.models))
        else:
            configs = (self,)
        configs = tuple(c for config in configs for c in (config, *config.fused_models()))
        seen: set[str] = set()
        for config in configs:
            if config.model_name in seen:  # llama-server's router refuses the same
                raise ValueError(f"model '{config.model_name}' appears multiple times "
                                 "(give each entry its own alias)")
            seen.add(config.model_name)
        for config in configs:
            for alias in config.aliases:  # the reference's own messages
                if alias in seen:
                    raise ValueError(f"alias '{alias}' for model '{config.model_name}' conflicts "
                                     "with existing model name or alias")
                seen.add(alias)
        for config in configs:
            for spec in config.lora_specs():
                if spec.name in seen:  # model names are matched first: one would be hidden
                    raise ValueError(f"'{spec.name}' names both a model and an adapter, or two "
                                     "adapters (give the adapter a name)")
                seen.add(spec.name)
        return configs

    def fused_models(self) -> tuple[GraphArgs, ...]:
        """A model of its own for each DoRA or full adapter: the base with it fused in."""
        fused = [s for s in self.adapter_specs() if s.kind != "lora"]
        if not fused:
            return ()
        keys = self.model_dump(exclude={"models", "adapters", "alias", "adapter", "lora_dir"},
                               exclude_unset=True)
        return tuple(GraphArgs.model_validate({**keys, "model": self.model, "alias": spec.name,
                                               "adapter": spec.path, "models": ()})
                     for spec in fused)

    @property
    def draft_path(self) -> str:
        """-md's folder or GGUF file, found as ``model_path`` finds -m's."""
        return local_path(self.model_draft or "")

    @property
    def model_path(self) -> str:
        return local_path(self.model)

    def template_source(self) -> str | None:
        """The chat template set here: ``chat_template``'s text (``chatml``: ChatML), else the
        text of ``chat_template_file``; None for the model's own."""
        if self.chat_template is not None:
            return CHATML if self.chat_template == "chatml" else self.chat_template
        return self.template_file_text()

    def template_file_text(self) -> str | None:
        """The text of ``chat_template_file`` (None when it names no file)."""
        if self.chat_template_file is None:
            return None
        for candidate in (Path(self.chat_template_file), REPO_ROOT / self.chat_template_file):
            if candidate.is_file():
                return candidate.read_text()
        return None

    def handle(self, handle: Handle) -> Handle:
        """``handle`` with this graph's transport."""
        return handle.options(_by_reference=self.handle_transport == "ray")

    @property
    def gather(self) -> Gather:
        return Gather(self.stream_interval_ms / 1e3, self.stream_interval_per_sequence_ms / 1e3,
                      max(self.stream_interval_max_ms, self.stream_interval_ms) / 1e3)

    @property
    def routed(self) -> bool:
        """Router mode: models found in a folder or a preset, each loaded on demand."""
        return self.models_dir is not None or self.models_preset is not None

    @property
    def model_name(self) -> str:
        return self.alias or self.model


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    path: str
    scale: float
    kind: str  # lora, dora or full
    given: str  # the path as the config or command line spells it (GET /lora-adapters)


def _model_entry(index: int, entry: dict[str, Any], shared: dict[str, Any]) -> GraphArgs:
    wide = sorted(set(entry) & {"models", *APP_WIDE})
    if wide:
        raise ValueError(f"models[{index}]: {', '.join(wide)} is set for the whole application, "
                         "not per model")
    try:
        return GraphArgs.model_validate({**shared, **entry, "models": ()})
    except ValidationError as exc:
        details = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                            for e in exc.errors())
        raise ValueError(f"models[{index}]: {details}") from None


def replica_ongoing_limit(config: GraphArgs) -> int:
    """Ray Serve's max_ongoing_requests for a model replica, the one rule the graph builder and
    the mlxray command use: every slot busy plus a full engine queue plus room for control calls,
    so that the engine's own bound (503 past ``max_queue``) is what a client meets, never a
    request parked in Ray Serve's router. A config that sets another value departs from it on
    purpose and says why (configs/autoscale.yaml)."""
    return config.n_parallel + config.max_queue + CONTROL_HEADROOM
