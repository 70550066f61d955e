"""GGUF block-quantized tensors as integer codes with a float32 scale and offset per group.

Every block format llmctl keeps quantized is w = code · scale + offset within a group of 16 or 32
weights along a row: Q4_0 (offset −8·d), Q4_1 (offset m) and Q4_K (scale d·sc, offset −dmin·m) have
4-bit codes; Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 have codes that fit a signed byte. The codes, scales and
offsets are read out of the blocks as gguf-py's own dequantizers read them (gguf/quants.py), so
code · scale + offset is the value gguf.quants.dequantize returns, bit for bit (tests check it).
Other types (F16, BF16, Q2_K, Q3_K, the IQ formats) return None: the caller dequantizes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

QK_K = 256  # weights per K-quant super-block


@dataclass
class GroupCodes:
    """codes [rows, K] (uint8 0..15 when bits is 4, else int8), scales and offsets [rows, K / group_size]."""

    codes: np.ndarray
    scales: np.ndarray
    offsets: np.ndarray
    bits: int

    @property
    def group_size(self) -> int:
        return int(self.codes.shape[1] // self.scales.shape[1])

    def stored_codes(self) -> np.ndarray:
        """As the CPU kernels read them: int8 [rows, K]; 4-bit packed to [rows, K / 2] uint8 with, in each
        32-code chunk, code j in the low nibble of byte j and code j + 16 in its high nibble (Q4_0's order)."""
        if self.bits == 8:
            return self.codes.astype(np.int8)
        chunks = self.codes.astype(np.uint8).reshape(self.codes.shape[0], -1, 2, 16)
        return (chunks[:, :, 0] | (chunks[:, :, 1] << np.uint8(4))).reshape(self.codes.shape[0], -1)


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)  # [blocks, 1]


def _nibbles(qs: np.ndarray, groups: int, width: int) -> np.ndarray:
    """Bytes [blocks, groups·width] → low nibbles then high nibbles of each `width`-byte run."""
    runs = qs.reshape(qs.shape[0], groups, 1, width) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (runs & np.uint8(0x0F)).reshape(qs.shape[0], -1)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks[:, :2])
    return _nibbles(blocks[:, 2:], 1, 16), d, -8 * d


def _q4_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _nibbles(blocks[:, 4:], 1, 16), _f16(blocks[:, :2]), _f16(blocks[:, 2:4])


def _q5_high_bits(qh: np.ndarray) -> np.ndarray:
    bits = qh.copy().view(np.uint32).reshape(-1, 1) >> np.arange(32, dtype=np.uint32).reshape(1, 32)
    return ((bits & np.uint32(1)).astype(np.uint8)) << np.uint8(4)


def _q5_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks[:, :2])
    q = _nibbles(blocks[:, 6:], 1, 16) | _q5_high_bits(blocks[:, 2:6])
    return (q.astype(np.int16) - 16).astype(np.int8), d, np.zeros_like(d)


def _q5_1(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = _nibbles(blocks[:, 8:], 1, 16) | _q5_high_bits(blocks[:, 4:8])
    return q.astype(np.int8), _f16(blocks[:, :2]), _f16(blocks[:, 2:4])


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _f16(blocks[:, :2])
    return blocks[:, 2:].copy().view(np.int8), d, np.zeros_like(d)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 6-bit scales and mins of Q4_K/Q5_K's eight sub-blocks (gguf-py's Q4_K.get_scale_min)."""
    d, m, m_d = np.split(scales.reshape(-1, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(-1, 8).astype(np.float32), mins.reshape(-1, 8).astype(np.float32)


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mins = _k_scale_min(blocks[:, 4:16])
    return _nibbles(blocks[:, 16:], 4, 32), d * sc, -(dmin * mins)


def _q5_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mins = _k_scale_min(blocks[:, 4:16])
    qh, qs = blocks[:, 16:48], blocks[:, 48:]
    low = _nibbles(qs, 4, 32)
    high = (qh.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
    q = low | (high.reshape(low.shape) << np.uint8(4))
    return q.astype(np.int8), d * sc, -(dmin * mins)


def _q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ql, qh = blocks[:, :128], blocks[:, 128:192]
    scales, d = blocks[:, 192:208].copy().view(np.int8).astype(np.float32), _f16(blocks[:, 208:210])
    low = _nibbles(ql, 2, 64).reshape(-1, 8, 32)
    high = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    q = (low | (high.reshape(low.shape) << np.uint8(4))).astype(np.int16) - 32
    scale = d * scales
    return q.reshape(-1, QK_K).astype(np.int8), scale, np.zeros_like(scale)


# type name → (bits, block bytes, weights per block, reader)
_Reader = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
FORMATS: dict[str, tuple[int, int, int, _Reader]] = {
    "Q4_0": (4, 18, 32, _q4_0),
    "Q4_1": (4, 20, 32, _q4_1),
    "Q4_K": (4, 144, QK_K, _q4_k),
    "Q5_0": (8, 22, 32, _q5_0),
    "Q5_1": (8, 24, 32, _q5_1),
    "Q5_K": (8, 176, QK_K, _q5_k),
    "Q6_K": (8, 210, QK_K, _q6_k),
    "Q8_0": (8, 34, 32, _q8_0),
}


def group_codes(raw: np.ndarray, type_name: str, rows: int, columns: int) -> GroupCodes | None:
    """The codes of a [rows, columns] tensor stored as `type_name` blocks (raw bytes), or None when llmctl
    does not keep that type quantized."""
    if type_name not in FORMATS:
        return None
    bits, block_bytes, per_block, read = FORMATS[type_name]
    if columns % per_block:
        return None
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * columns // per_block, block_bytes)
    codes, scales, offsets = read(blocks)
    return GroupCodes(codes.reshape(rows, columns), scales.reshape(rows, -1).astype(np.float32),
                      offsets.reshape(rows, -1).astype(np.float32), bits)
