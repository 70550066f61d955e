"""Which attention backend fits a model: positional encoding first, then what is installed."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from llmctl.model.spec import ModelSpec


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "flash-attn" | "triton" | "torch-sdpa"
    reason: str


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def choose_attention_backend(spec: ModelSpec, *, cuda: bool | None = None) -> BackendChoice:
    """ALiBi -> Triton on a GPU or torch SDPA, never FlashAttention 3 (it has no ALiBi);
    RoPE/learned -> FlashAttention when installed, else Triton on a GPU, else torch SDPA."""
    cuda = _cuda_available() if cuda is None else cuda
    triton_ok = cuda and _installed("triton")
    if spec.positional.kind == "alibi":
        if triton_ok:
            return BackendChoice("triton", "ALiBi bias is applied inside llmctl's Triton paged-attention kernel "
                                           "(FlashAttention 3 has no ALiBi support)")
        return BackendChoice("torch-sdpa", "ALiBi needs an additive bias: torch SDPA with a bias mask "
                                           "(FlashAttention 3 has no ALiBi support; no GPU Triton here)")
    if spec.attention.kind == "MLA" and not cuda:
        return BackendChoice("torch-sdpa", "MLA: latent K/V expanded per head, then torch SDPA (no GPU here)")
    if cuda and _installed("flash_attn"):
        return BackendChoice("flash-attn", f"{spec.positional.describe()}: FlashAttention is installed")
    if triton_ok:
        return BackendChoice("triton", f"{spec.positional.describe()}: llmctl's Triton paged-attention kernel "
                                       "(FlashAttention not installed)")
    return BackendChoice("torch-sdpa", f"{spec.positional.describe()}: torch SDPA "
                                       "(no GPU; FlashAttention and Triton need CUDA)")
