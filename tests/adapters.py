"""Adapter folders written at test time in mlx-lm's format, by mlx-lm's own classes: what
``mlx_lm.lora`` saves after training (``adapter_config.json`` and the trainable parameters in
``adapters.safetensors``), with seeded random weights instead of trained ones."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import MODEL, mlx_lm_ids

# what mlx_lm.lora writes into adapter_config.json, trimmed to what loading reads
LORA_PARAMETERS = {"rank": 8, "scale": 20.0, "dropout": 0.0}


def write_adapter(folder: Path, seed: int, kind: str = "lora", num_layers: int = 2,
                  keys: list[str] | None = None, magnitude: float = 0.02) -> Path:
    """An adapter of the embedded model: LoRA or DoRA on ``num_layers`` last layers (``keys``:
    the module names, mlx-lm's default when None), or a full fine-tune; every trained
    parameter is set from ``seed`` (a LoRA's B is zero until trained: here it is not)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load

    mx.random.seed(seed)  # LoRA's A starts random too: the whole folder is the seed's
    model, _ = load(MODEL)
    model.freeze()
    parameters = {**LORA_PARAMETERS, **({"keys": keys} if keys else {})}
    if kind == "full":
        model.unfreeze()
    else:
        linear_to_lora_layers(model, num_layers, parameters, use_dora=kind == "dora")
    trained = tree_map(lambda p: p + magnitude * mx.random.normal(p.shape, dtype=p.dtype),
                       model.trainable_parameters())
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), dict(tree_flatten(trained)))
    config = {"fine_tune_type": kind, "num_layers": num_layers, "lora_parameters": parameters,
              "model": MODEL}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def mlx_lm_greedy(prompt: str, max_tokens: int, adapter: Path | None = None) -> list[int]:
    """mlx-lm's own greedy generation, the adapter loaded by mlx_lm.utils.load."""
    from mlx_lm.utils import load

    model, tokenizer = load(MODEL, adapter_path=str(adapter) if adapter else None)
    return mlx_lm_ids(model, tokenizer.encode(prompt), max_tokens)
