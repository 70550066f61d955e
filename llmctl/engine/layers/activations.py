"""The gated activations of the MLPs (silu(gate) * up, gelu_tanh(gate) * up over a fused [gate | up]
projection): one C++ pass on CPUs, one Triton launch on GPUs (`fused_ops`), torch elsewhere; the torch forms
are the references the kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.engine.layers import fused_ops
from llmctl.kernels import cpu as cpu_kernels


def _fusable(fused: torch.Tensor) -> bool:
    return fused.dim() == 2 and fused.stride(1) == 1 and fused.is_contiguous() and cpu_kernels.fused_layers_for(fused)


def silu_and_mul(fused: torch.Tensor, intermediate: int) -> torch.Tensor:
    """silu(gate) * up of the [gate | up] projection."""
    if fused_ops.applies(fused) and fused.dim() == 2:
        return fused_ops.gated_activation(fused, intermediate, False)
    if _fusable(fused):
        return cpu_kernels.silu_and_mul(fused)
    return silu_and_mul_reference(fused, intermediate)


def silu_and_mul_reference(fused: torch.Tensor, intermediate: int) -> torch.Tensor:
    gate, up = fused.split(intermediate, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(fused: torch.Tensor, intermediate: int) -> torch.Tensor:
    """gelu(gate, tanh approximation) * up (Gemma's GeGLU)."""
    if fused_ops.applies(fused) and fused.dim() == 2:
        return fused_ops.gated_activation(fused, intermediate, True)
    if _fusable(fused):
        return cpu_kernels.gelu_tanh_and_mul(fused)
    gate, up = fused.split(intermediate, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
