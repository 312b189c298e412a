"""Tokenization and token pieces as llama.cpp renders them.

llama-server's content is the concatenation of per-token pieces (raw bytes), not a streaming
detokenizer's output: mlx-lm's BPEStreamingDetokenizer drops the first token's leading space, so
we keep a bytes table per vocabulary id instead.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

from .fim import fim_by_text, fim_from_metadata
from .types import EngineError

_SPM_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Vocab:
    """Wraps a Hugging Face tokenizer with llama.cpp's tokenize/detokenize semantics."""

    def __init__(self, hf_tokenizer, eos_token_ids: set[int] | None = None,
                 fim_ids: dict[str, int] | None = None):
        self.hf = hf_tokenizer
        self.backend = getattr(hf_tokenizer, "backend_tokenizer", None) or getattr(
            hf_tokenizer, "_tokenizer", None
        )
        self.n_vocab = len(hf_tokenizer)
        self.bos_id = hf_tokenizer.bos_token_id
        probe = hf_tokenizer.encode("a", add_special_tokens=True)
        self.add_bos = self.bos_id is not None and bool(probe) and probe[0] == self.bos_id
        eos = set(eos_token_ids or ())
        if hf_tokenizer.eos_token_id is not None:
            eos.add(hf_tokenizer.eos_token_id)
        self.eog_ids = eos
        self.special_ids = set(hf_tokenizer.all_special_ids)
        for tid, added in getattr(hf_tokenizer, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                self.special_ids.add(tid)
        self.pieces, self.special_pieces = self._build_pieces()
        # FIM role (pre, suf, mid, pad, rep, sep) -> token id: engine/fim.py
        self.fim_ids = {**fim_by_text(hf_tokenizer.get_vocab()), **(fim_ids or {})}
        # llama.cpp ends generation at the FIM pad, repo and file-separator tokens too
        self.eog_ids |= {self.fim_ids[r] for r in ("pad", "rep", "sep") if r in self.fim_ids}
        self._literal: Any = None  # _encoder(parse_special=False), made on first use
        self._literal_lock = threading.Lock()

    def _build_pieces(self) -> tuple[list[bytes], list[bytes]]:
        tokens = self.hf.convert_ids_to_tokens(list(range(self.n_vocab)))
        decoder = _decoder_type(self.backend)
        byte_map = _byte_decoder()
        pieces: list[bytes] = []
        special: list[bytes] = []
        for tid, tok in enumerate(tokens):
            tok = tok or ""
            if tid in self.special_ids:
                pieces.append(b"")
                special.append(tok.encode())
                continue
            if decoder == "ByteLevel" and all(ch in byte_map for ch in tok):
                piece = bytes(byte_map[ch] for ch in tok)
            elif (m := _SPM_BYTE.match(tok)) is not None:
                piece = bytes([int(m.group(1), 16)])
            elif decoder == "Sequence" or "▁" in tok:
                piece = tok.replace("▁", " ").encode()
            else:
                piece = self.hf.decode([tid]).encode()
            pieces.append(piece)
            special.append(piece)
        return pieces, special

    def tokenize(self, text: str, add_special: bool, parse_special: bool = True) -> list[int]:
        """Safe from several threads at once. A fast tokenizer's ``encode_batch`` lets go of the
        GIL while it works (``encode`` holds it throughout), so the ingress's event loop runs on
        while a large prompt is tokenized on a worker thread."""
        encoder = self._encoder(parse_special)
        if encoder is not None:
            ids = encoder.encode_batch([text], add_special_tokens=False)[0].ids
        else:
            ids = self.hf.encode(text, add_special_tokens=False)
        if add_special and self.add_bos:
            ids = [self.bos_id, *ids]
        return list(ids)

    def _encoder(self, parse_special: bool) -> Any:
        """The fast tokenizer for ``parse_special``: the model's own, or for literal text a copy
        that never matches special tokens. Two tokenizers rather than one whose
        ``encode_special_tokens`` flag each call sets: another thread's call would see it."""
        if self.backend is None or not hasattr(self.backend, "encode_special_tokens"):
            return None
        if parse_special:
            return self.backend
        with self._literal_lock:
            if self._literal is None:
                literal = type(self.backend).from_str(self.backend.to_str())
                literal.encode_special_tokens = True
                self._literal = literal
            return self._literal

    def tokenize_prompt(self, prompt) -> list[int]:
        """One sub-prompt of spec §2.1: a string, a token array, or a mixed array."""
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special=True)
        if isinstance(prompt, dict) and "prompt_string" in prompt:
            if "multimodal_data" in prompt:
                raise EngineError(
                    "Multimodal data provided, but model does not support multimodal requests."
                )
            return self.tokenize_prompt(prompt["prompt_string"])
        if isinstance(prompt, list):
            return self.tokenize_mixed(prompt, add_special=True)
        raise EngineError(
            '"prompt" elements must be a string, a list of tokens, a JSON object containing a '
            "prompt string, or a list of mixed strings & tokens."
        )

    def tokenize_mixed(self, items: list, add_special: bool,
                       parse_special: bool = True) -> list[int]:
        """llama.cpp's tokenize_mixed: ints verbatim; only a leading string gets BOS."""
        out: list[int] = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                out += self.tokenize(item, add_special=add_special and i == 0,
                                     parse_special=parse_special)
            elif isinstance(item, bool):
                out.append(int(item))
            elif isinstance(item, int):
                out.append(item)
            elif isinstance(item, float):
                out.append(int(item))
            else:
                raise EngineError(
                    '"prompt" elements must be a string, a list of tokens, a JSON object '
                    "containing a prompt string, or a list of mixed strings & tokens."
                )
        return out

    def detokenize(self, tokens: list[int], special: bool = True) -> str:
        table = self.special_pieces if special else self.pieces
        return b"".join(table[t] for t in tokens if 0 <= t < self.n_vocab).decode(
            "utf-8", errors="replace"
        )

    def piece(self, token: int, special: bool = False) -> bytes:
        table = self.special_pieces if special else self.pieces
        return table[token] if 0 <= token < self.n_vocab else b""


def load_vocab(path: str) -> Vocab:
    """The tokenizer alone (no MLX), for the ingress: validation and /tokenize need no model."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    from .gguf import is_gguf

    if is_gguf(path):
        from .gguf.reader import GGUFFile

        return gguf_vocab(GGUFFile(path))

    hf = AutoTokenizer.from_pretrained(path)
    eos: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if file.is_file():
            value = json.loads(file.read_text()).get("eos_token_id")
            eos.update(value if isinstance(value, list) else [] if value is None else [value])
    return Vocab(hf, eos)


def gguf_vocab(file) -> Vocab:
    """The tokenizer of an open GGUF file (engine/gguf/reader.py's GGUFFile)."""
    from .gguf.tokenizer import hf_tokenizer

    hf, eog = hf_tokenizer(file)
    return Vocab(hf, eog, fim_from_metadata(lambda key: file.get(key, None), len(hf)))


def _decoder_type(backend) -> str:
    try:
        import json

        return json.loads(backend.to_str()).get("decoder", {}).get("type", "") or ""
    except Exception:  # noqa: BLE001 - a tokenizer without a serializable backend
        return ""
