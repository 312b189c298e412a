"""The fill-in-the-middle tokens of a vocabulary, found as llama.cpp's llama_vocab finds them:
a GGUF file's ``tokenizer.ggml.fim_*_token_id`` metadata first (the deprecated
``prefix``/``suffix``/``middle`` names too), else the first token whose text is one of the
known FIM texts (src/llama-vocab.cpp)."""

from __future__ import annotations

FIM_TEXTS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
            "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
            "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
            "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}

GGUF_KEYS: dict[str, tuple[str, ...]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}


def fim_by_text(token_ids: dict[str, int]) -> dict[str, int]:
    """Each FIM role whose text the vocabulary holds -> that token's id (the lowest id when
    several texts of one role are present)."""
    found: dict[str, int] = {}
    for role, texts in FIM_TEXTS.items():
        ids = [token_ids[t] for t in texts if t in token_ids]
        if ids:
            found[role] = min(ids)
    return found


def fim_from_metadata(get, n_vocab: int) -> dict[str, int]:
    """The FIM ids a GGUF file's metadata names (``get`` reads one key, None when absent)."""
    found: dict[str, int] = {}
    for role, keys in GGUF_KEYS.items():
        for key in keys:
            value = get(key)
            if value is not None and 0 <= int(value) < n_vocab:
                found[role] = int(value)
                break
    return found
