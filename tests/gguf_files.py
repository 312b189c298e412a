"""Test models, built at test time: small random-weight HF folders from mlx-lm's own classes
(the embedded model's tokenizer), and GGUF files written from them with the ``gguf`` package's
writer the way llama.cpp's convert_hf_to_gguf.py lays them out (llama's Q/K rows permuted, Gemma's
norms stored as 1 + w, Llama 3's rope factors and Phi-3's long-rope factors as tensors). K-quant
blocks, which gguf-py cannot write, are packed here with numpy from random bytes."""

from __future__ import annotations

import importlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from mlx.utils import tree_flatten

REPO = Path(__file__).resolve().parent.parent
REFERENCE_GGUF = REPO / "tests" / "fixtures" / "model.gguf"
TINY = REPO / "models" / "tiny-python"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")
Q = GGMLQuantizationType

_SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 2000,
          "rms_norm_eps": 1e-5, "max_position_embeddings": 2048}
# one small config per family, each with its quirk switched on
FAMILIES: dict[str, dict[str, Any]] = {
    "llama3": {**_SMALL, "model_type": "llama", "rope_theta": 500000.0,
               "tie_word_embeddings": False,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "qwen2": {**_SMALL, "model_type": "qwen2", "rope_theta": 1000000.0,
              "tie_word_embeddings": True},
    "qwen3": {**_SMALL, "model_type": "qwen3", "head_dim": 32, "rope_theta": 1000000.0,
              "tie_word_embeddings": False},
    "gemma3": {**_SMALL, "model_type": "gemma3_text", "num_hidden_layers": 6, "rms_norm_eps": 1e-6,
               "query_pre_attn_scalar": 16, "sliding_window": 8, "sliding_window_pattern": 6,
               "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0},
    "phi3": {**_SMALL, "model_type": "phi3", "num_key_value_heads": 4, "head_dim": None,
             "max_position_embeddings": 4096, "original_max_position_embeddings": 512,
             "rope_theta": 10000.0, "tie_word_embeddings": False,
             "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 4 for i in range(8)],
                              "short_factor": [1.0 + i / 16 for i in range(8)]}},
}
ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
        "phi3": "phi3"}


def hf_folder(folder: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """An HF-layout folder (config.json, model.safetensors, the tiny tokenizer) holding a
    random-weight model of ``config`` built with mlx-lm's class."""
    config = {k: v for k, v in config.items() if v is not None}
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config["model_type"] == "gemma3_text":
            continue  # Gemma ties its output to the embedding
        scale = 0.1 if p.ndim == 1 else 1 / math.sqrt(p.shape[-1])
        centre = 1.0 if name.endswith("norm.weight") and "gemma" not in config["model_type"] else 0
        weights[name] = mx.array((centre + scale * rng.standard_normal(p.shape)).astype(np.float32))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(TINY / name, folder / name)
    return folder


def hf_tensors(folder: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """An HF folder's config and its tensors, renamed and laid out as llama.cpp's converter
    writes them (float32)."""
    config = json.loads((folder / "config.json").read_text())
    arch = ARCH[config["model_type"]]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    out: dict[str, np.ndarray] = {}
    for name, w in mx.load(str(folder / "model.safetensors")).items():
        data = np.array(w, dtype=np.float32)
        if arch == "llama" and ".q_proj." in name:
            data = permute(data, config["num_attention_heads"], config["num_attention_heads"])
        if arch == "llama" and ".k_proj." in name:
            data = permute(data, config["num_attention_heads"], config["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + 1  # Gemma3Model.modify_tensors: norm_shift
        out[names.get_name(name, try_suffixes=(".weight", ".bias"))] = data
    if arch == "llama" and config.get("rope_scaling"):
        out["rope_freqs.weight"] = llama3_rope_factors(config)
    if arch == "phi3" and config.get("rope_scaling"):
        out["rope_factors_long.weight"] = np.array(config["rope_scaling"]["long_factor"],
                                                   np.float32)
        out["rope_factors_short.weight"] = np.array(config["rope_scaling"]["short_factor"],
                                                    np.float32)
    return config, out


def permute(weights: np.ndarray, n_head: int, n_head_kv: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors (rope_freqs)."""
    scaling = config["rope_scaling"]
    base, dim = config["rope_theta"], config["head_dim"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def write_gguf(path: Path, config: dict[str, Any], tensors: dict[str, Any],
               file_type: int = gguf.LlamaFileType.ALL_F32, **extra: Any) -> Path:
    """A GGUF file: the converter's metadata for ``config``, the reference file's tokenizer,
    and ``tensors`` (a float32 array, or (raw uint8 blocks, type) for a block type).
    ``extra`` sets or, with None, removes metadata keys."""
    arch = ARCH[config["model_type"]]
    w = GGUFWriter(path, arch)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(config.get("num_key_value_heads") or heads)
    w.add_rope_freq_base(config.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(int(file_type))
    if arch != "phi3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(config["sliding_window"])
    if arch == "phi3":
        w.add_sliding_window(config["max_position_embeddings"])
        w.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
    copy_tokenizer(w)
    for key, value in extra.items():
        if value is not None:
            w.add_key_value(key, *value)
    for name, value in tensors.items():
        if isinstance(value, tuple):
            w.add_tensor(name, value[0], raw_shape=value[0].shape, raw_dtype=value[1])
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def copy_tokenizer(w: GGUFWriter, source: Path = REFERENCE_GGUF, **replace: Any) -> None:
    """The reference file's tokenizer keys (the embedded model's vocabulary)."""
    reader = GGUFReader(source)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[-1] if len(field.types) > 1 else None
            w.add_key_value(key, replace.get(key, field.contents()), field.types[0], sub)


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks of a block type (its float16 scale fields small and finite)."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    halves = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
              Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q2_K: (size - 4, size - 2),
              Q.Q3_K: (size - 2,), Q.Q6_K: (size - 2,)}[qtype]
    # the largest |scale x quant| a block's float16 scale is multiplied by: weights stay small
    reach = {Q.Q4_0: 8, Q.Q4_1: 15, Q.Q5_0: 16, Q.Q5_1: 31, Q.Q8_0: 128, Q.Q4_K: 63 * 15,
             Q.Q5_K: 63 * 31, Q.Q2_K: 15 * 3, Q.Q3_K: 32 * 4, Q.Q6_K: 128 * 32}[qtype]
    for start in halves:
        scale = rng.uniform(0.01, 0.1, len(blocks)).astype(np.float32) / reach
        scale = scale.astype(np.float16)
        blocks[:, start:start + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw
