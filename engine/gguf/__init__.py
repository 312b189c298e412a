"""GGUF files served directly: llama.cpp's model files read with the ``gguf`` package.

``reader`` opens a file and says what it holds (metadata, tensors, llama-server's figures),
``quants`` turns each tensor type into MLX weights (exact, repacked or dequantized) or refuses
it, ``tokenizer`` builds the tokenizer from ``tokenizer.ggml.*``, ``families`` maps an
architecture onto its mlx-lm model (with the file's layout quirks undone), and ``loader`` puts
them together (engine/model.py makes the LoadedModel, engine/vocab.py the Vocab: nothing here
imports either). Nothing here but ``loader`` and ``quants.to_mlx`` imports MLX, so the ingress
can read a file's tokenizer without it.
"""

from __future__ import annotations

from pathlib import Path


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")

