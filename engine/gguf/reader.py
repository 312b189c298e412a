"""A GGUF file's metadata, tensors and the figures llama-server reports for it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType
from gguf.gguf_reader import ReaderTensor

Q = GGMLQuantizationType
F = LlamaFileType


class GGUFError(ValueError):
    """A file mlxray cannot serve right: the message says which part and why."""


# llama_model_ftype_name (llama-model-loader.cpp): the /props model_ftype and /models meta.ftype
FTYPE_NAMES = {
    F.ALL_F32: "all F32", F.MOSTLY_F16: "F16", F.MOSTLY_BF16: "BF16", F.MOSTLY_Q4_0: "Q4_0",
    F.MOSTLY_Q4_1: "Q4_1", F.MOSTLY_Q5_0: "Q5_0", F.MOSTLY_Q5_1: "Q5_1", F.MOSTLY_Q8_0: "Q8_0",
    F.MOSTLY_MXFP4_MOE: "MXFP4 MoE", F.MOSTLY_NVFP4: "NVFP4",
    F.MOSTLY_Q2_K: "Q2_K - Medium", F.MOSTLY_Q2_K_S: "Q2_K - Small",
    F.MOSTLY_Q3_K_S: "Q3_K - Small", F.MOSTLY_Q3_K_M: "Q3_K - Medium",
    F.MOSTLY_Q3_K_L: "Q3_K - Large", F.MOSTLY_Q4_K_S: "Q4_K - Small",
    F.MOSTLY_Q4_K_M: "Q4_K - Medium", F.MOSTLY_Q5_K_S: "Q5_K - Small",
    F.MOSTLY_Q5_K_M: "Q5_K - Medium", F.MOSTLY_Q6_K: "Q6_K",
    F.MOSTLY_TQ1_0: "TQ1_0 - 1.69 bpw ternary", F.MOSTLY_TQ2_0: "TQ2_0 - 2.06 bpw ternary",
    F.MOSTLY_IQ2_XXS: "IQ2_XXS - 2.0625 bpw", F.MOSTLY_IQ2_XS: "IQ2_XS - 2.3125 bpw",
    F.MOSTLY_IQ2_S: "IQ2_S - 2.5 bpw", F.MOSTLY_IQ2_M: "IQ2_M - 2.7 bpw",
    F.MOSTLY_IQ3_XS: "IQ3_XS - 3.3 bpw", F.MOSTLY_IQ3_XXS: "IQ3_XXS - 3.0625 bpw",
    F.MOSTLY_IQ1_S: "IQ1_S - 1.5625 bpw", F.MOSTLY_IQ1_M: "IQ1_M - 1.75 bpw",
    F.MOSTLY_IQ4_NL: "IQ4_NL - 4.5 bpw", F.MOSTLY_IQ4_XS: "IQ4_XS - 4.25 bpw",
    F.MOSTLY_IQ3_S: "IQ3_S - 3.4375 bpw", F.MOSTLY_IQ3_M: "IQ3_S mix - 3.66 bpw",
}
# the loader's guess from the most common tensor type when general.file_type is missing
GUESSED_FTYPE = {
    Q.F32: F.ALL_F32, Q.F16: F.MOSTLY_F16, Q.BF16: F.MOSTLY_BF16, Q.Q4_0: F.MOSTLY_Q4_0,
    Q.Q4_1: F.MOSTLY_Q4_1, Q.Q5_0: F.MOSTLY_Q5_0, Q.Q5_1: F.MOSTLY_Q5_1, Q.Q8_0: F.MOSTLY_Q8_0,
    Q.Q2_K: F.MOSTLY_Q2_K, Q.Q3_K: F.MOSTLY_Q3_K_M, Q.Q4_K: F.MOSTLY_Q4_K_M,
    Q.Q5_K: F.MOSTLY_Q5_K_M, Q.Q6_K: F.MOSTLY_Q6_K, Q.TQ1_0: F.MOSTLY_TQ1_0,
    Q.TQ2_0: F.MOSTLY_TQ2_0, Q.IQ2_XXS: F.MOSTLY_IQ2_XXS, Q.IQ2_XS: F.MOSTLY_IQ2_XS,
    Q.IQ2_S: F.MOSTLY_IQ2_S, Q.IQ3_XXS: F.MOSTLY_IQ3_XXS, Q.IQ1_S: F.MOSTLY_IQ1_S,
    Q.IQ1_M: F.MOSTLY_IQ1_M, Q.IQ4_NL: F.MOSTLY_IQ4_NL, Q.IQ4_XS: F.MOSTLY_IQ4_XS,
    Q.IQ3_S: F.MOSTLY_IQ3_S, Q.MXFP4: F.MOSTLY_MXFP4_MOE,
}


def ftype_name(file_type: int | None, types: Counter) -> str:
    if file_type is None:  # the most common type; an unknown one guesses F32, as llama.cpp
        guess = GUESSED_FTYPE.get(types.most_common(1)[0][0], F.ALL_F32) if types else F.ALL_F32
        return f"{FTYPE_NAMES[guess]} (guessed)"
    try:
        return FTYPE_NAMES[F(file_type)]
    except (ValueError, KeyError):
        return "unknown, may not work"


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file: its name, type, shape in numpy order and its raw data view."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data: np.ndarray  # memory-mapped: raw blocks for block types, values for float types

    @classmethod
    def of(cls, t: ReaderTensor) -> Tensor:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        return cls(t.name, t.tensor_type, shape, int(t.n_elements), int(t.n_bytes), t.data)


class GGUFFile:
    """A GGUF file opened read-only (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._reader = GGUFReader(self.path, "r")
        except (OSError, ValueError) as exc:  # not GGUF, truncated, or a type id unknown here
            raise GGUFError(f"cannot read GGUF file {self.path}: {exc}") from None
        self.tensors = {t.name: Tensor.of(t) for t in self._reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def has(self, key: str) -> bool:
        return key in self._reader.fields

    @cached_property
    def arch(self) -> str:
        return str(self.get("general.architecture", ""))

    def arch_get(self, key: str, default: Any = None) -> Any:
        """An architecture key: ``arch_get("context_length")`` reads ``llama.context_length``."""
        return self.get(f"{self.arch}.{key}", default)

    @property
    def context_length(self) -> int:
        return int(self.arch_get("context_length", 0) or 0)

    @property
    def n_params(self) -> int:
        """llama_model_n_params: every tensor's element count."""
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def size_bytes(self) -> int:
        """llama_model_size: every tensor's bytes as stored."""
        return sum(t.n_bytes for t in self.tensors.values())

    @property
    def ftype(self) -> str:
        types = Counter(t.type for t in self.tensors.values())
        return ftype_name(self.get("general.file_type"), types)


def context_length(path: str | Path) -> int:
    """The training context a GGUF file declares (llama-server's n_ctx for -c 0)."""
    try:
        return GGUFFile(path).context_length
    except GGUFError:
        return 0
