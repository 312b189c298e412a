"""The bench's models: the embedded one (a folder), or one of realistic shape built at bench time.

``llama-27m`` is a random-weight Llama of mlx-lm's own classes (hidden 512, 8 layers, ~27.7M
parameters) with the embedded model's tokenizer, saved as an MLX folder that mlxray and
mlx_lm.server both load; a step is heavy on a small CPU, where the embedded model's is not. It is
built once per machine (seeded, a few seconds) under the temporary directory and reused.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from . import REPO

TOKENIZER = REPO / "models" / "tiny-python"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SEED = 18
# BOS, EOS and the tokenizer's 128 lone bytes (0x80-0xFF): their output rows are zeroed, so that
# greedy text is valid UTF-8 (mlxray fails a stream that is not, as llama-server does)
MUTED = [0, 1, *range(96, 190), *range(224, 258)]

BUILT = {
    "llama-27m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 1408,
        "vocab_size": 2000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "torch_dtype": "float32",
    },
}


def model_folder(name: str, root: Path | None = None) -> str:
    """The folder for ``--model``: a built model's (built first if absent), else ``name``."""
    if name not in BUILT:
        return name
    folder = (root or Path(tempfile.gettempdir()) / "mlxray-bench-models") / name
    if not (folder / "model.safetensors").exists():
        build(BUILT[name], folder)
    return str(folder)


def build(config: dict, folder: Path) -> Path:
    """config.json, seeded random weights and the embedded model's tokenizer; written to a
    sibling folder first and renamed, so that an interrupted build leaves nothing half done."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    mx.random.seed(SEED)
    model = model_class(args_class.from_dict(config))
    keep = mx.ones((config["vocab_size"], 1))
    keep[mx.array(MUTED)] = 0
    model.lm_head.weight = model.lm_head.weight * keep
    mx.eval(model.parameters())
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    mx.save_safetensors(str(partial / "model.safetensors"),
                        dict(tree_flatten(model.parameters())), metadata={"format": "mlx"})
    (partial / "config.json").write_text(json.dumps(config, indent=1))
    (partial / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}))
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER / name, partial / name)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder
