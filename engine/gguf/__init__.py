"""GGUF files served directly: llama.cpp's model files read with the ``gguf`` package.

``reader`` opens a file and says what it holds (metadata, tensors, llama-server's figures),
``quants`` turns each tensor type into MLX weights (exact, repacked or dequantized) or refuses
it, ``tokenizer`` builds the tokenizer from ``tokenizer.ggml.*``, ``families`` maps an
architecture onto its mlx-lm model (with the file's layout quirks undone), and ``loader`` puts
them together. Nothing here but ``loader`` and ``quants.to_mlx`` imports MLX, so the ingress can
read a file's tokenizer without it.
"""

from __future__ import annotations

from pathlib import Path


def is_gguf(path: str | Path) -> bool:
    return str(path).lower().endswith(".gguf")


def load_gguf(path: str, device: str = "auto"):
    """A GGUF file as mlxray's LoadedModel (engine/model.py)."""
    from ..device_choice import choose
    from ..model import LoadedModel
    from .loader import build_model
    from .reader import GGUFFile
    from .tokenizer import build_vocab

    device_used = choose(device)
    file = GGUFFile(path)
    model, config = build_model(file)
    return LoadedModel(
        model=model, vocab=build_vocab(file), path=str(Path(path).resolve()),
        n_ctx_train=file.context_length, n_embd=int(config["hidden_size"]),
        n_params=file.n_params, size_bytes=file.size_bytes,
        chat_template=file.get("tokenizer.chat_template"), ftype=file.ftype,
        device=device_used,
    )
