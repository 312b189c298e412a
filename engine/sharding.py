"""One rank's part of a model split over an MLX distributed group (deployments/serve/shards.py).

``tensor``: every layer's projections split over the ranks (mlx-lm's ``Model.shard``, an
all_sum after each attention and MLP). ``pipeline``: each rank runs a run of whole layers
(mlx-lm's ``model.model.pipeline``) and passes the hidden state on; the last stage's output is
gathered to every rank, so every rank samples the same token. mlx-lm 0.32 gives pipelining to
a few architectures only; for llama-shaped models (llama, and those mlx-lm maps onto it) this
module adds it, the same way mlx-lm's pipelined models do it.

/props reports the whole model's parameters and size, read from the weights' shapes without
loading them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.llama import LlamaModel
from mlx_lm.models.llama import Model as LlamaCausal

from .device_choice import choose as choose_device
from .model import LoadedModel, describe


class ShardError(ValueError):
    """The model cannot be split this way (its architecture, or its head or layer counts)."""


def load_sharded(path: str, mode: str, group: Any, device: str = "auto") -> LoadedModel:
    """This rank's part of the model folder ``path``; every rank calls it together."""
    from mlx_lm.utils import get_total_parameters, load_model, sharded_load

    loaded_on = choose_device(device)
    whole, _ = load_model(Path(path), lazy=True, strict=False)
    check(whole, mode, group.size())
    if mode == "pipeline" and _llama_shaped(whole):
        model, wrapper, config = _llama_pipeline(path, group)
    elif mode == "pipeline":
        model, wrapper, config = sharded_load(path, group, None, return_config=True)
    else:
        model, wrapper, config = sharded_load(path, None, group, return_config=True)
    loaded = describe(model, wrapper, config, path, loaded_on)
    loaded.n_params = get_total_parameters(whole)
    loaded.size_bytes = sum(p.nbytes for _, p in _flat(whole.parameters()))
    return loaded


def check(model: Any, mode: str, n: int) -> None:
    """Refuse, before any weight is read, a split this architecture cannot take."""
    if mode == "tensor":
        if not hasattr(model, "shard"):
            raise ShardError(f"mlx-lm cannot split '{model.model_type}' models by tensor; "
                             "use shard_mode: pipeline")
        args = model.args
        heads = (getattr(args, "num_attention_heads", n), getattr(args, "num_key_value_heads", n))
        if any(h % n for h in heads if h):
            raise ShardError(f"shard_mode tensor over {n} ranks needs attention and key-value "
                             f"head counts divisible by {n} (the model has {heads[0]} and "
                             f"{heads[1]})")
        return
    pipelined = hasattr(getattr(model, "model", None), "pipeline") or _llama_shaped(model)
    if not pipelined:
        raise ShardError(f"mlx-lm cannot pipeline '{model.model_type}' models; use "
                         "shard_mode: tensor")
    if len(model.layers) < n:
        raise ShardError(f"{len(model.layers)} layers cannot be split over {n} ranks")


def _llama_shaped(model: Any) -> bool:
    return (type(model) is LlamaCausal and type(model.model) is LlamaModel
            and model.model.swa_idx is None)


def _llama_pipeline(path: str, group: Any) -> tuple[Any, Any, dict]:
    """A llama model whose layers this rank does not run are dropped before the weights load."""
    from mlx_lm.utils import load_model, load_tokenizer

    model, config = load_model(Path(path), lazy=True, strict=False)
    model.__class__ = PipelinedLlama
    model.model.__class__ = PipelinedLlamaModel
    model.model.pipeline(group)
    mx.eval(model.parameters())
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))  # all loaded
    wrapper = load_tokenizer(Path(path), {"trust_remote_code": True},
                             eos_token_ids=config.get("eos_token_id"))
    return model, wrapper, config


class PipelinedLlamaModel(LlamaModel):
    """LlamaModel with mlx-lm's PipelineMixin stages: rank r runs the layers after those of
    ranks r+1 .. N-1 (rank N-1 the first ones), receiving from r+1 and sending to r-1."""

    def pipeline(self, group: Any) -> None:
        self.group = group
        self.pipeline_rank, self.pipeline_size = group.rank(), group.size()
        base, extra = divmod(len(self.layers), self.pipeline_size)
        split = [base + (1 if r < extra else 0) for r in range(self.pipeline_size)]
        self.start_idx = sum(split[self.pipeline_rank + 1:])
        self.end_idx = self.start_idx + split[self.pipeline_rank]
        self.layers = self.layers[: self.end_idx]
        self.layers[: self.start_idx] = [None] * self.start_idx  # weight names keep their index

    @property
    def pipeline_layers(self) -> list:
        return self.layers[self.start_idx: self.end_idx]

    def __call__(self, inputs: mx.array, cache=None, input_embeddings=None) -> mx.array:
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        rank, size, group = self.pipeline_rank, self.pipeline_size, self.group
        layers = self.pipeline_layers
        cache = cache if cache is not None else [None] * len(layers)
        mask = create_attention_mask(h, cache[0])
        if rank < size - 1:
            h = mx.distributed.recv_like(h, rank + 1, group=group)
        for layer, c in zip(layers, cache):
            h = layer(h, mask, cache=c)
        if rank != 0:
            h = mx.distributed.send(h, rank - 1, group=group)
            if cache[-1] is not None:
                cache[-1].keys = mx.depends(cache[-1].keys, h)
        h = mx.distributed.all_gather(h, group=group)[: h.shape[0]]
        return self.norm(h)


class PipelinedLlama(LlamaCausal):
    """The causal model over a pipelined LlamaModel: caches for this rank's layers only."""

    @property
    def layers(self) -> list:
        return self.model.pipeline_layers

    def make_cache(self) -> list:
        return [KVCache() for _ in self.layers]


def _flat(tree: Any) -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    return tree_flatten(tree)
