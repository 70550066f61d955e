"""A linear layer with GPTQ or AWQ packed weights.

The packed tensors stay as loaded, on the model's device (so memory is what `llmctl plan
--quantization` predicts). On CUDA, 4-bit weights run through llmctl's Triton W4A16 GEMM
(`llmctl.kernels.w4a16`), which dequantizes inside its K loop; elsewhere (CPUs, other bit
widths) the weight is dequantized in torch at every forward.
Fused projections (QKV, gate/up) concatenate their parts along the output dimension,
which both formats allow because they pack outputs in whole groups of 8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.quant_formats import check_g_idx, unpack_awq, unpack_gptq


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
        device = self.qweight.device  # where the model was built: the checkpoint is read on the CPU
        for name in ("qweight", "qzeros", "scales"):
            setattr(self, name, torch.cat([part[name] for part in parts], dim=1).to(device).contiguous())
        self.scales = self.scales.to(torch.float16)  # as stored (the loader may have upcast it)
        groups = -(-self.in_features // self.group_size)
        if self.scales.shape != (groups, self.out_features):
            raise ValueError(f"scales have shape {tuple(self.scales.shape)}, expected {(groups, self.out_features)}")
        for part in parts:
            check_g_idx(part.get("g_idx"), self.in_features, self.group_size)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.qzeros, self.scales))

    def dequantize(self) -> torch.Tensor:
        """[out, in] float weight, unpacked by the same code that reads and writes the formats."""
        packed = {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales}
        if self.method == "gptq":
            return unpack_gptq(packed, self.bits, self.group_size).dequantize()
        return unpack_awq(packed, self.group_size).dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.bits == 4:
            return self.forward_w4a16(x)
        return F.linear(x, self.dequantize().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def forward_w4a16(self, x: torch.Tensor) -> torch.Tensor:
        """Through the Triton kernel (on CPU tensors only under TRITON_INTERPRET=1, which tests use)."""
        from llmctl.kernels.w4a16 import w4a16_matmul

        out = w4a16_matmul(x.reshape(-1, self.in_features), self.method, self.qweight, self.qzeros, self.scales,
                           None, self.group_size)
        if self.bias is not None:
            out += self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)
