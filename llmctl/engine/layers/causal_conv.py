"""The causal depthwise convolution in front of the recurrent mixers (Mamba2, gated DeltaNet), its window of the last
`kernel - 1` inputs carried between steps in the state cache (causal-conv1d's algorithm, in torch)."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F


def conv_chunk(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [L, C] after the window `state` [C, K-1] of earlier inputs: the convolution's outputs [L, C] and the new
    window (its last K-1 inputs)."""
    window = torch.cat([state.to(x.dtype), x.t()], dim=1)  # [C, K-1+L]
    out = F.conv1d(window[None], weight[:, None, :], bias, groups=weight.shape[0])[0]  # [C, L]
    return out.t(), window[:, -state.shape[1]:]


def conv_step(x: torch.Tensor, states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """One new input per sequence, x [B, C], after windows [B, C, K-1]: outputs [B, C] and the new windows."""
    window = torch.cat([states.to(x.dtype), x[:, :, None]], dim=2)  # [B, C, K]
    out = (window * weight).sum(-1)
    return (out + bias if bias is not None else out), window[:, :, 1:]


def conv_step_in_slots(x: torch.Tensor, windows: torch.Tensor, slots: torch.Tensor | slice, weight: torch.Tensor,
                       bias: torch.Tensor | None, kernels: ModuleType | None) -> torch.Tensor:
    """conv_step on the cache's windows of `slots`, updated there: by the decode kernels' conv_decode where they
    have one (the C++ kernels: each window shifted in place), else in torch (gathered, stepped, written back)."""
    if kernels is not None and hasattr(kernels, "conv_decode") and isinstance(slots, torch.Tensor):
        out: torch.Tensor = kernels.conv_decode(windows, slots, x, weight, bias)
        return out
    out, windows[slots] = conv_step(x, windows[slots], weight, bias)
    return out
