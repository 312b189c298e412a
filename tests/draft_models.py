"""Draft models for speculative decoding tests, built at test time from the embedded model
(models/tiny-python): the same folder with its first layers only (mlx-lm's own Llama class
reads it), so the draft shares the tokenizer and agrees with the target on some tokens and not
others.

    from tests.draft_models import build_truncated_draft
    folder = build_truncated_draft(Path("/tmp/draft"), layers=1)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .conftest import MODEL


def build_truncated_draft(folder: Path, layers: int = 1) -> Path:
    import mlx.core as mx

    source = Path(MODEL)
    config = json.loads((source / "config.json").read_text())
    weights = mx.load(str(source / "model.safetensors"))
    kept = {name: w for name, w in weights.items()
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers}
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), kept, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers},
                                                   indent=1))
    for item in source.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, folder / item.name)
    return folder


def build_deep_target(folder: Path, extra_layers: int = 22, scale: float = 0.03,
                      seed: int = 31) -> Path:
    """A target for the embedded model to draft for: the embedded model with ``extra_layers``
    more layers after its own, each of mlx-lm's random initialization with its output
    projections (attention's o_proj, the MLP's down_proj) scaled by ``scale``, so each adds a
    small perturbation to the residual stream. The target costs what a deep model costs per
    token and mostly, not always, chooses the embedded model's tokens."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    source = Path(MODEL)
    config = json.loads((source / "config.json").read_text())
    own = config["num_hidden_layers"]
    deep = {**config, "num_hidden_layers": own + extra_layers}
    model_class, args_class = _get_classes(deep)
    mx.random.seed(seed)
    weights = dict(tree_flatten(model_class(args_class.from_dict(deep)).parameters()))
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * scale
    weights.update(mx.load(str(source / "model.safetensors")))  # its own layers, embeddings, head
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(deep, indent=1))
    for item in source.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, folder / item.name)
    return folder


if __name__ == "__main__":
    import sys

    print(build_truncated_draft(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1))
