"""RMSNorm as the model families use it: float32 math as transformers does, one fused op with the residual add
folded in — C++ on CPUs, Triton on GPUs (`fused_ops`). A [tokens, heads, head_dim] input is normed per head
(QK-norm); on a GPU it is read through its strides, so q and k stay views of their projection."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.engine.layers import fused_ops
from llmctl.kernels import cpu as cpu_kernels


class RMSNorm(nn.Module):
    """Llama's RMSNorm, computed in float32 as transformers does; on CPUs one fused C++ op."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    unit_offset = False  # Gemma's norms scale by (1 + weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused_ops.applies(x, self.weight):
            return fused_ops.rms_norm(x, self.weight, self.eps, None, self.unit_offset)
        if x.dim() == 3:  # per head, on a CPU: the C++ kernel takes rows
            return self.cpu_forward(x.reshape(-1, x.shape[-1])).view(x.shape)
        return self.cpu_forward(x)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the residual add fused in (the sum written into `residual`)."""
        if fused_ops.applies(x, self.weight) and x.dim() == 2 and residual.is_contiguous() \
                and residual.shape == x.shape and residual.dtype == x.dtype:
            return fused_ops.rms_norm(x, self.weight, self.eps, residual, self.unit_offset), residual
        return self.cpu_add_and_norm(x, residual)

    def cpu_forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused(x, self.weight):
            return cpu_kernels.rms_norm(x, self.weight, self.eps)
        return self.reference(x)

    def cpu_add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if _fused(x, self.weight) and _fused(residual, self.weight):
            return cpu_kernels.rms_norm(residual, self.weight, self.eps, residual=x), residual
        total = x + residual
        return self.reference(total), total

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _fused(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.dim() == 2 and x.is_contiguous() and x.dtype == weight.dtype and cpu_kernels.fused_layers_for(x)
