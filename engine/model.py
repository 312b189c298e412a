"""Loading a model and its tokenizer (a model folder, or a GGUF file: engine/gguf), on the device
the graph chose (engine/device_choice.py: the GPU where MLX has one, else the CPU)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from .device_choice import choose as choose_device
from .vocab import Vocab


@dataclass
class LoadedModel:
    model: Any
    vocab: Vocab
    path: str
    n_ctx_train: int
    n_embd: int
    n_params: int
    size_bytes: int
    chat_template: str | None
    ftype: str = "all F32"
    device: mx.Device | None = None  # where it was loaded: the engine decodes there
    adapter: str | None = None  # the folder fused into the weights at load


def load_model(path: str, adapter: str | None = None, device: str = "auto",
               config_overrides: dict | None = None) -> LoadedModel:
    """A GGUF file (engine/gguf), else mlx_lm.load: a local folder, or a Hugging Face id when
    the hub is reachable; ``adapter``: a DoRA or full fine-tune folder fused into the weights
    (engine/lora.py); ``device``: where it runs (engine/device_choice.py); ``config_overrides``:
    keys laid over the folder's config.json (RoPE settings: deployments/cli/rope.py)."""
    from .gguf import is_gguf

    if is_gguf(path):
        loaded = _load_gguf(path, device)
        if adapter is not None:
            _fuse(loaded.model, adapter)
            loaded.adapter = adapter
        return loaded
    from mlx_lm import load

    loaded_on = choose_device(device)
    model, wrapper, config = load(path, model_config=config_overrides or None,
                                  return_config=True)
    if adapter is not None:
        _fuse(model, adapter)
    loaded = describe(model, wrapper, config, path, loaded_on)
    loaded.adapter = adapter
    return loaded


def describe(model: Any, wrapper: Any, config: dict, path: str,
             loaded_on: mx.Device) -> LoadedModel:
    """The LoadedModel of an mlx-lm model and tokenizer wrapper (whole or one rank's shard)."""
    from mlx_lm.utils import get_total_parameters

    hf = getattr(wrapper, "_tokenizer", wrapper)
    vocab = Vocab(hf, set(getattr(wrapper, "eos_token_ids", None) or ()))
    args = getattr(model, "args", None)
    n_ctx_train = int(getattr(args, "max_position_embeddings", 0) or 0)
    n_embd = int(getattr(args, "hidden_size", 0) or 0)
    params = _leaves(model.parameters())
    n_params = get_total_parameters(model)  # a quantized weight counts its unpacked values
    size_bytes = sum(p.nbytes for p in params)
    local = Path(path)
    return LoadedModel(
        model=model,
        vocab=vocab,
        path=str(local.resolve()) if local.exists() else path,
        n_ctx_train=n_ctx_train,
        n_embd=n_embd,
        n_params=n_params,
        size_bytes=size_bytes,
        chat_template=getattr(hf, "chat_template", None),
        ftype=_ftype(params, config.get("quantization")),
        device=loaded_on,
    )


def _fuse(model: Any, adapter: str) -> None:
    from .lora import fuse_adapter

    fuse_adapter(model, adapter)
    mx.eval(model.parameters())


def _ftype(params: list[mx.array], quantization: dict | None) -> str:
    """llama.cpp's file-type words: "all F32", "mostly BF16", "mostly Q4" ..."""
    if quantization:
        return f"mostly Q{quantization.get('bits', 4)}"
    names = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16"}
    kinds = {names.get(p.dtype, str(p.dtype)) for p in params}
    if len(kinds) == 1:
        return f"all {kinds.pop()}"
    counts: dict[str, int] = {}
    for p in params:
        key = names.get(p.dtype, str(p.dtype))
        counts[key] = counts.get(key, 0) + p.size
    return f"mostly {max(counts, key=counts.get)}"


def _leaves(tree) -> list[mx.array]:
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, dict):
        return [leaf for v in tree.values() for leaf in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [leaf for v in tree for leaf in _leaves(v)]
    return []


def _load_gguf(path: str, device: str) -> LoadedModel:
    """A GGUF file (engine/gguf) as a LoadedModel: its weights built for mlx-lm, its tokenizer."""
    from .gguf.loader import build_model
    from .gguf.reader import GGUFFile
    from .vocab import gguf_vocab

    device_used = choose_device(device)
    file = GGUFFile(path)
    model, config = build_model(file)
    return LoadedModel(
        model=model, vocab=gguf_vocab(file), path=str(Path(path).resolve()),
        n_ctx_train=file.context_length, n_embd=int(config["hidden_size"]),
        n_params=file.n_params, size_bytes=file.size_bytes,
        chat_template=file.get("tokenizer.chat_template"), ftype=file.ftype,
        device=device_used,
    )
