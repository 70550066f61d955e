"""On-disk formats that vLLM and transformers read: GPTQ v1 and AWQ GEMM, packed in int32.

Weights here are in `nn.Linear` orientation, [out, in]; integer values `q` are in
[0, 2^bits), one scale and zero point per (group of `group_size` inputs, output column).

GPTQ v1: qweight [in·bits/32, out] packs along the input dimension; qzeros [groups,
out·bits/32] packs along the output dimension and stores zero − 1; scales fp16 [groups,
out]; g_idx int32 [in]. AWQ GEMM: qweight [in, out/8] and qzeros [groups, out/8] pack along
the output dimension in the nibble order 0, 2, 4, 6, 1, 3, 5, 7; zeros are stored as is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column j of a pack of 8 sits at nibble AWQ_ORDER.index(j)


@dataclass
class QuantizedWeight:
    """Integer weights with their group scales and zero points, [out, in] orientation."""

    q: torch.Tensor  # int32 [out, in], values in [0, 2^bits)
    scales: torch.Tensor  # float32 [out, groups]
    zeros: torch.Tensor  # int32 [out, groups]
    bits: int
    group_size: int  # inputs per group (the whole input when per channel)
    g_idx: torch.Tensor | None = None  # act-order GPTQ: each input's group; None: input // group_size

    def dequantize(self) -> torch.Tensor:
        groups = input_groups(self.g_idx, self.q.shape[1], self.group_size, self.q.device)
        return (self.q - self.zeros[:, groups]).float() * self.scales[:, groups]

    def split_rows(self, sizes: list[int]) -> list[QuantizedWeight]:
        """The weights of linears quantized stacked (their rows one after the other), apart again."""
        parts = zip(torch.split(self.q, sizes), torch.split(self.scales, sizes), torch.split(self.zeros, sizes))
        return [QuantizedWeight(q.contiguous(), scales.contiguous(), zeros.contiguous(), self.bits, self.group_size,
                                self.g_idx) for q, scales, zeros in parts]


def input_groups(g_idx: torch.Tensor | None, in_features: int, group_size: int,
                 device: torch.device | None = None) -> torch.Tensor:
    """The quantization group of every input column: g_idx as stored, or contiguous groups."""
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(in_features, device=device) // max(group_size, 1)


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack along dim 0: rows r*k .. r*k+k-1 (k = 32/bits) into row r, lowest bits first."""
    per = 32 // bits
    values = (values.to(torch.int64) & ((1 << bits) - 1)).view(values.shape[0] // per, per, *values.shape[1:])
    packed = torch.zeros(values.shape[0], *values.shape[2:], dtype=torch.int64)
    for i in range(per):
        packed |= values[:, i] << (bits * i)
    return _to_int32(packed)


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    per, mask = 32 // bits, (1 << bits) - 1
    wide = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(wide >> (bits * i)) & mask for i in range(per)]
    return torch.stack(parts, dim=1).reshape(packed.shape[0] * per, *packed.shape[1:]).to(torch.int32)


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    """Reinterpret unsigned 32-bit values as int32 (the top bit becomes the sign)."""
    values = values & 0xFFFFFFFF
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


def pack_gptq(weight: QuantizedWeight) -> dict[str, torch.Tensor]:
    bits, in_features = weight.bits, weight.q.shape[1]
    qweight = _pack_rows(weight.q.t().contiguous(), bits)  # [in/k, out]
    qzeros = _pack_cols(weight.zeros.t().contiguous() - 1, bits)  # [groups, out/k], zero - 1 as v1 stores it
    return {
        "qweight": qweight,
        "qzeros": qzeros,
        "scales": weight.scales.t().contiguous().to(torch.float16),
        "g_idx": (torch.arange(in_features) // weight.group_size).to(torch.int32),
    }


def _pack_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack along the last dimension (k consecutive columns into one int32, lowest bits first)."""
    return _pack_rows(values.t().contiguous(), bits).t().contiguous()


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    return unpack_rows(packed.t().contiguous(), bits).t().contiguous()


def unpack_gptq(tensors: dict[str, torch.Tensor], bits: int, group_size: int) -> QuantizedWeight:
    q = unpack_rows(tensors["qweight"], bits).t().contiguous()  # [out, in]
    zeros = (unpack_cols(tensors["qzeros"], bits) + 1).t().contiguous()  # [out, groups]
    g_idx = permuted_g_idx(tensors.get("g_idx"), q.shape[1], group_size, zeros.shape[1])
    return QuantizedWeight(q, tensors["scales"].float().t().contiguous(), zeros, bits, group_size, g_idx)


def permuted_g_idx(g_idx: torch.Tensor | None, in_features: int, group_size: int,
                   groups: int) -> torch.Tensor | None:
    """An act-order (desc_act) checkpoint's g_idx, checked; None when it is the contiguous order
    (what llmctl writes, and what lets kernels skip the lookup)."""
    if g_idx is None:
        return None
    if g_idx.shape != (in_features,):
        raise ValueError(f"g_idx has shape {tuple(g_idx.shape)}, expected ({in_features},)")
    if torch.equal(g_idx.long(), input_groups(None, in_features, group_size, g_idx.device)):
        return None
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise ValueError(f"g_idx names groups outside 0..{groups - 1}")
    return g_idx.to(torch.int32)


def _awq_pack(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] 4-bit values -> [rows, cols/8] int32 in AWQ's interleaved nibble order."""
    rows, cols = values.shape
    grouped = values.to(torch.int64).view(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= grouped[:, :, column] << (4 * nibble)
    return _to_int32(packed)


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    rows, packs = packed.shape
    wide = packed.to(torch.int64) & 0xFFFFFFFF
    values = torch.zeros(rows, packs, 8, dtype=torch.int64, device=packed.device)
    for nibble, column in enumerate(AWQ_ORDER):
        values[:, :, column] = (wide >> (4 * nibble)) & 0xF
    return values.view(rows, packs * 8).to(torch.int32)


def pack_awq(weight: QuantizedWeight) -> dict[str, torch.Tensor]:
    if weight.bits != 4:
        raise ValueError("the AWQ GEMM format holds 4-bit weights only")
    return {
        "qweight": _awq_pack(weight.q.t().contiguous()),  # [in, out/8]
        "qzeros": _awq_pack(weight.zeros.t().contiguous()),  # [groups, out/8]
        "scales": weight.scales.t().contiguous().to(torch.float16),  # [groups, out]
    }


def unpack_awq(tensors: dict[str, torch.Tensor], group_size: int) -> QuantizedWeight:
    q = awq_unpack(tensors["qweight"]).t().contiguous()
    zeros = awq_unpack(tensors["qzeros"]).t().contiguous()
    return QuantizedWeight(q, tensors["scales"].float().t().contiguous(), zeros, 4, group_size)


def packed_shard_range(method: str, name: str, along: str, start: int, stop: int, bits: int,
                       group_size: int) -> tuple[int, int, int] | None:
    """(dim, lo, hi) of packed tensor `name` that holds outputs (along="out") or inputs
    (along="in") [start, stop) of a GPTQ/AWQ linear; None: every rank reads it whole.

    GPTQ: qweight [in/pack, out], qzeros [groups, out/pack], scales [groups, out], g_idx [in].
    AWQ:  qweight [in, out/pack], qzeros [groups, out/pack], scales [groups, out].
    """
    pack = 32 // bits
    if along == "out":
        if name == "g_idx":
            return None
        factor = pack if name == "qzeros" or (method == "awq" and name == "qweight") else 1
        return 1, start // factor, stop // factor
    if name == "g_idx":
        return 0, start, stop
    factor = (pack if method == "gptq" else 1) if name == "qweight" else group_size
    return 0, start // factor, stop // factor
