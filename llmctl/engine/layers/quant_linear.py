"""A linear layer with GPTQ or AWQ packed weights, dequantized in torch at every forward.

This is the slot a Triton W4A16 kernel fills later: the packed tensors stay as loaded
(so memory is what `llmctl plan --quantization` predicts), only `forward` changes.
Fused projections (QKV, gate/up) concatenate their parts along the output dimension,
which both formats allow because they pack outputs in whole groups of 8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

AWQ_UNORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column j of a pack is stored at nibble AWQ_UNORDER[j]


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, method: str, bits: int,
                 group_size: int) -> None:
        super().__init__()
        if method not in ("gptq", "awq"):
            raise ValueError(f"unsupported quantization method {method!r}")
        self.in_features, self.out_features = in_features, out_features
        self.method, self.bits = method, bits
        self.group_size = in_features if group_size in (-1, 0, None) else group_size
        self.pack = 32 // bits
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("qweight", torch.empty(0, dtype=torch.int32))
        self.register_buffer("qzeros", torch.empty(0, dtype=torch.int32))
        self.register_buffer("scales", torch.empty(0, dtype=torch.float16))

    def load_parts(self, parts: list[dict[str, torch.Tensor]]) -> None:
        """Packed tensors of one or more linears that this layer runs as one (concatenated outputs)."""
        for name in ("qweight", "qzeros", "scales"):
            setattr(self, name, torch.cat([part[name] for part in parts], dim=1).contiguous())
        self.scales = self.scales.to(torch.float16)  # as stored (the loader may have upcast it)
        groups = -(-self.in_features // self.group_size)
        if self.scales.shape != (groups, self.out_features):
            raise ValueError(f"scales have shape {tuple(self.scales.shape)}, expected {(groups, self.out_features)}")
        for part in parts:
            g_idx = part.get("g_idx")
            if g_idx is not None and not torch.equal(g_idx.long(), torch.arange(self.in_features) // self.group_size):
                raise ValueError("GPTQ act-order checkpoints (permuted g_idx) are not supported")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.qzeros, self.scales))

    def _unpack(self, packed: torch.Tensor, along_rows: bool) -> torch.Tensor:
        shifts = torch.arange(0, 32, self.bits, device=packed.device, dtype=torch.int32)
        mask = (1 << self.bits) - 1
        if along_rows:  # GPTQ qweight: [in/k, out] -> [in, out]
            values = (packed.unsqueeze(1) >> shifts.view(1, -1, 1)) & mask
            return values.reshape(-1, packed.shape[1])
        values = (packed.unsqueeze(-1) >> shifts.view(1, 1, -1)) & mask  # [..., out/k, k]
        if self.method == "awq":
            values = values[..., list(AWQ_UNORDER)]
        return values.reshape(packed.shape[0], -1)

    def dequantize(self) -> torch.Tensor:
        """[out, in] float weight."""
        q = self._unpack(self.qweight, along_rows=self.method == "gptq")  # [in, out]
        zeros = self._unpack(self.qzeros, along_rows=False)  # [groups, out]
        if self.method == "gptq":
            zeros = zeros + 1  # GPTQ v1 stores zero - 1
        groups = torch.arange(self.in_features, device=q.device) // self.group_size
        weight = (q - zeros[groups]).float() * self.scales.float()[groups]
        return weight.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantize().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
