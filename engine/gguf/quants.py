"""Tensor types: what each becomes in MLX, and the numpy work of getting it there.

- F32, F16, BF16: the same values, the same dtype.
- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K: MLX affine quantized weights, group 32, float32
  scales and biases, 4/5/8 bits. Every block of these types is ``scale * q + bias`` over 32
  values with one scale and one offset (K-quants: per 32-value sub-block), so the repacking is
  exact: MLX dequantizes to the same float32 numbers as ggml (and gguf-py).
- the other block types gguf-py can dequantize (Q2_K, Q3_K, Q6_K, IQ*, TQ*, MXFP4, NVFP4):
  gguf-py's float32 dequantization, which costs memory (the loader logs how much).
- anything else (Q8_1, Q8_K, integer and F64 tensors, types gguf-py cannot dequantize) cannot
  be loaded right and is refused before loading starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from .reader import Tensor

Q = GGMLQuantizationType
GROUP = 32
FLOATS = (Q.F32, Q.F16, Q.BF16)
BITS = {Q.Q4_0: 4, Q.Q4_1: 4, Q.Q5_0: 5, Q.Q5_1: 5, Q.Q8_0: 8, Q.Q4_K: 4, Q.Q5_K: 5}
DEQUANTIZED = (Q.Q2_K, Q.Q3_K, Q.Q6_K, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4, Q.IQ2_XXS,
               Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL, Q.IQ4_XS)
LOADABLE = (*FLOATS, *BITS, *DEQUANTIZED)
ROWS_PER_CHUNK_ELEMENTS = 1 << 22  # bounds the numpy temporaries of one repacking step


@dataclass
class Affine:
    """MLX's affine quantized layout of one weight: ``weight`` packed uint32, float32 groups."""

    weight: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int


def half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte ``start`` of every block, as float32 (one column)."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-value layout of 16 bytes: low nibbles are values 0-15, high ones 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def high_bits(qh: np.ndarray, n: int) -> np.ndarray:
    """Bit i of a little-endian bit field (n bits per row), as 0/1 per value."""
    return np.unpackbits(qh, axis=1, count=n, bitorder="little")


def k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's eight 6-bit scales and mins per super-block (12 bytes)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def k_low(qs: np.ndarray) -> np.ndarray:
    """K-quant low nibbles: 4 runs of 32 bytes, each run's low then high nibbles a sub-block."""
    runs = qs.reshape(len(qs), 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (runs & 0x0F).reshape(len(qs), 256)


def blocks_q4_0(b: np.ndarray):
    d = half(b, 0)
    return nibbles(b[:, 2:18]), d, -8 * d


def blocks_q4_1(b: np.ndarray):
    return nibbles(b[:, 4:20]), half(b, 0), half(b, 2)


def blocks_q5_0(b: np.ndarray):
    d = half(b, 0)
    return nibbles(b[:, 6:22]) | (high_bits(b[:, 2:6], 32) << 4), d, -16 * d


def blocks_q5_1(b: np.ndarray):
    return nibbles(b[:, 8:24]) | (high_bits(b[:, 4:8], 32) << 4), half(b, 0), half(b, 2)


def blocks_q8_0(b: np.ndarray):
    d = half(b, 0)
    q = (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return q, d, -128 * d


def blocks_q4_k(b: np.ndarray):
    sc, mn = k_scales(b[:, 4:16])
    return k_low(b[:, 16:144]), half(b, 0) * sc, -(half(b, 2) * mn)


def blocks_q5_k(b: np.ndarray):
    sc, mn = k_scales(b[:, 4:16])
    qh = b[:, 16:48].reshape(len(b), 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = k_low(b[:, 48:176]) | ((qh & 1).reshape(len(b), 256) << 4)
    return q, half(b, 0) * sc, -(half(b, 2) * mn)


UNPACK = {Q.Q4_0: blocks_q4_0, Q.Q4_1: blocks_q4_1, Q.Q5_0: blocks_q5_0, Q.Q5_1: blocks_q5_1,
          Q.Q8_0: blocks_q8_0, Q.Q4_K: blocks_q4_k, Q.Q5_K: blocks_q5_k}


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing: the values of a row as one little-endian bit stream, read as uint32."""
    rows, cols = q.shape
    if bits == 8:
        return np.ascontiguousarray(q).view(np.uint32)
    if bits == 4:
        return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8).view(np.uint32)
    words = q.reshape(rows, cols // 8, 8).astype(np.uint64) << (
        np.arange(8, dtype=np.uint64) * np.uint64(bits))
    stream = words.sum(axis=2, dtype=np.uint64).view(np.uint8).reshape(rows, cols // 8, 8)
    return np.ascontiguousarray(stream[:, :, :bits]).reshape(rows, -1).view(np.uint32)


def repack(t: Tensor) -> Affine:
    """A 2-D Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K tensor as MLX affine groups of 32."""
    rows, cols = t.shape
    block, size = GGML_QUANT_SIZES[t.type]
    raw = t.data.reshape(rows, cols // block * size)
    step = max(1, ROWS_PER_CHUNK_ELEMENTS // cols)
    parts = [_repack_rows(raw[start:start + step], t.type, cols) for start in range(0, rows, step)]
    return Affine(*(np.concatenate(p) for p in zip(*parts)), bits=BITS[t.type])


def _repack_rows(raw: np.ndarray, qtype: GGMLQuantizationType, cols: int):
    rows = len(raw)
    block, size = GGML_QUANT_SIZES[qtype]
    q, scales, biases = UNPACK[qtype](np.ascontiguousarray(raw).reshape(-1, size))
    groups = cols // GROUP
    return (pack(q.reshape(rows, cols).astype(np.uint8), BITS[qtype]),
            scales.reshape(rows, groups).astype(np.float32),
            biases.reshape(rows, groups).astype(np.float32))


def dequantize(t: Tensor) -> np.ndarray:
    """gguf-py's float32 values of a block tensor."""
    return gguf_quants.dequantize(t.data, t.type).reshape(t.shape).astype(np.float32, copy=False)


def bf16_bits(t: Tensor) -> np.ndarray:
    """BF16 values as their raw uint16 bits (MLX views them as bfloat16)."""
    return np.ascontiguousarray(t.data).view(np.uint16).reshape(t.shape)


def refusal(t: Tensor) -> str | None:
    """Why a tensor cannot be loaded right, or None."""
    if t.type not in LOADABLE:
        return f"{t.name} ({t.type.name})"
    if t.type in BITS and len(t.shape) != 2:
        return f"{t.name} ({t.type.name}, {len(t.shape)}-D)"
    return None
