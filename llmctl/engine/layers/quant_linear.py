"""A linear layer with GPTQ or AWQ packed weights, or float8 e4m3 weights with block/channel scales (fp8).

The packed tensors stay as loaded, on the model's device (so memory is what `llmctl plan
--quantization` predicts). On CUDA, 4-bit weights run through llmctl's Triton W4A16 GEMM
(`llmctl.kernels.w4a16`), which dequantizes inside its K loop. On CPUs, 4-bit weights with
contiguous groups of a multiple of 32 are repacked once at load (`pack_for_cpu`) for the C++
int4 kernel (`llmctl.kernels.cpu.int4_linear`), which decodes them as it multiplies, for float32
activations; elsewhere (other bit widths, act-order, bfloat16) the weight is dequantized in torch
at every forward. fp8 weights are held K-major as bytes (`qweight` [K, N]) with float32 scales per group of
`group_size` inputs ([K / group, N]: a 128 × 128 block's scale repeated along its columns; per channel: one row)
and run through the FP8 W8A16 Triton GEMM (`llmctl.kernels.fp8_w8a16`) on CUDA.
Fused projections (QKV, gate/up) concatenate their parts along the output dimension,
which both formats allow because they pack outputs in whole groups of 8. Act-order GPTQ
(desc_act, a permuted g_idx) keeps each part's g_idx, since every part was quantized
with its own column order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.quant_formats import permuted_g_idx, unpack_awq, unpack_gptq
from llmctl.engine.layers.coded_linear import CodedWeight
from llmctl.kernels import cpu as cpu_kernels


class QuantLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, method: str, bits: int,
                 group_size: int) -> None:
        super().__init__()
        if method not in ("gptq", "awq", "fp8"):
            raise ValueError(f"unsupported quantization method {method!r}")
        self.in_features, self.out_features = in_features, out_features
        self.method, self.bits = method, bits
        self.group_size = in_features if group_size in (-1, 0, None) else group_size
        self.pack = 1 if method == "fp8" else 32 // bits  # outputs per stored column word
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("qweight", torch.empty(0, dtype=torch.int32))
        self.register_buffer("qzeros", torch.empty(0, dtype=torch.int32))
        self.register_buffer("scales", torch.empty(0, dtype=torch.float16))
        self.register_buffer("g_idx", None)  # act-order: [parts, in] int32, one row per fused part
        self.part_outputs: list[int] = [out_features]
        self.cpu_int4: CodedWeight | None = None  # the 4-bit codes repacked for the CPU kernel

    @property
    def stored_kinds(self) -> tuple[str, ...]:
        """The tensors each part arrives as (fp8: the e4m3 bytes K-major and their float32 scales)."""
        return ("qweight", "scales") if self.method == "fp8" else ("qweight", "qzeros", "scales")

    def load_parts(self, parts: list[dict[str, torch.Tensor]]) -> None:
        """Packed tensors of one or more linears that this layer runs as one (concatenated outputs)."""
        device = self.qweight.device  # where the model was built: the checkpoint is read on the CPU
        for name in self.stored_kinds:
            setattr(self, name, torch.cat([part[name] for part in parts], dim=1).to(device).contiguous())
        # GPTQ/AWQ store float16 scales (the loader keeps them so); fp8's block scales stay float32
        self.scales = self.scales.to(torch.float32 if self.method == "fp8" else torch.float16)
        groups = -(-self.in_features // self.group_size)
        if self.scales.shape != (groups, self.out_features):
            raise ValueError(f"scales have shape {tuple(self.scales.shape)}, expected {(groups, self.out_features)}")
        self.part_outputs = [part["scales"].shape[1] for part in parts]
        g_idx = [permuted_g_idx(part.get("g_idx"), self.in_features, self.group_size, groups) for part in parts]
        if any(g is not None for g in g_idx):
            if self.method != "gptq":
                raise ValueError("a permuted g_idx (act-order) belongs to GPTQ, not AWQ")
            contiguous = torch.arange(self.in_features, dtype=torch.int32) // self.group_size
            self.g_idx = torch.stack([contiguous if g is None else g for g in g_idx]).to(device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.qzeros, self.scales))

    def dequantize(self) -> torch.Tensor:
        """[out, in] float weight, unpacked by the same code that reads and writes the formats."""
        if self.method == "fp8":
            scales = self.scales.float().repeat_interleave(self.group_size, 0)[:self.in_features]
            return (self.qweight.view(torch.float8_e4m3fn).float() * scales).t()
        if self.g_idx is None:
            return self._dequantize_part(self.qweight, self.qzeros, self.scales, None)
        return torch.cat([self._dequantize_part(*part) for part in self._act_order_parts()])

    def _dequantize_part(self, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                         g_idx: torch.Tensor | None) -> torch.Tensor:
        packed = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
        if self.method == "awq":
            return unpack_awq(packed, self.group_size).dequantize()
        if g_idx is not None:
            packed["g_idx"] = g_idx
        return unpack_gptq(packed, self.bits, self.group_size).dequantize()

    def _act_order_parts(self) -> list[tuple[torch.Tensor, ...]]:
        """(qweight, qzeros, scales, g_idx) of each fused part (GPTQ packs outputs unpacked in qweight)."""
        parts, start = [], 0
        for index, width in enumerate(self.part_outputs):
            stop = start + width
            parts.append((self.qweight[:, start:stop], self.qzeros[:, start // self.pack:stop // self.pack],
                          self.scales[:, start:stop], self.g_idx[index]))
            start = stop
        return parts

    def pack_for_cpu(self) -> int:
        """Repack 4-bit codes for the C++ int4 kernel (w = code · scale − zero · scale); the bytes added, 0 when
        this layer's format is not one it takes."""
        if self.bits != 4 or self.g_idx is not None or self.in_features % 32 or self.group_size % 32 \
                or self.qweight.device.type != "cpu" or cpu_kernels.unavailable_reason() is not None:
            return 0
        packed = {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales}
        weight = unpack_awq(packed, self.group_size) if self.method == "awq" else \
            unpack_gptq(packed, self.bits, self.group_size)
        scales = weight.scales.float().contiguous()
        offsets = (-weight.zeros.float() * scales).contiguous()
        self.cpu_int4 = CodedWeight.compact(cpu_kernels.pack_int4(weight.q), scales, offsets)
        return self.cpu_int4.nbytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_int4 is not None and x.device.type == "cpu" and x.dtype == torch.float32:
            return self.forward_cpu_int4(x)
        if x.is_cuda and self.method == "fp8":
            return self.forward_fp8(x)
        if x.is_cuda and (self.bits == 4 or (self.bits == 8 and self.method == "gptq")):
            return self.forward_w4a16(x)
        return F.linear(x, self.dequantize().to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))

    def forward_cpu_int4(self, x: torch.Tensor) -> torch.Tensor:
        """Through CodedWeight.matmul: the kernel for few rows, the weight decoded once for many."""
        flat = x.reshape(-1, self.in_features).contiguous()
        return self.cpu_int4.matmul(flat, self.bias).view(*x.shape[:-1], self.out_features)

    def forward_fp8(self, x: torch.Tensor) -> torch.Tensor:
        """Through the FP8 W8A16 Triton kernel (on CPU tensors only under TRITON_INTERPRET=1, which tests use)."""
        from llmctl.kernels.fp8_w8a16 import fp8_matmul

        out = fp8_matmul(x.reshape(-1, self.in_features), self.qweight, self.scales, self.group_size)
        if self.bias is not None:
            out += self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def forward_w4a16(self, x: torch.Tensor) -> torch.Tensor:
        """Through the Triton kernel (on CPU tensors only under TRITON_INTERPRET=1, which tests use)."""
        from llmctl.kernels.w4a16 import w4a16_matmul

        flat = x.reshape(-1, self.in_features)
        if self.g_idx is None:
            out = w4a16_matmul(flat, self.method, self.qweight, self.qzeros, self.scales, None, self.group_size,
                               bits=self.bits)
        else:
            out = torch.cat([w4a16_matmul(flat, self.method, *part, self.group_size, bits=self.bits)
                             for part in self._act_order_parts()], dim=1)
        if self.bias is not None:
            out += self.bias.to(out.dtype)
        return out.view(*x.shape[:-1], self.out_features)
