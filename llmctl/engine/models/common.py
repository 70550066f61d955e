"""Pieces shared by the model families: step context, RMSNorm, weight loading helpers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch import nn

from llmctl.engine.layers.attention import AttentionBackend, KVCache


@dataclass
class StepContext:
    """What every layer needs for one step besides its hidden states."""

    positions: torch.Tensor  # [T]
    kv_caches: list[KVCache]  # one per layer
    backend: AttentionBackend


class RMSNorm(nn.Module):
    """Llama's RMSNorm, computed in float32 as transformers does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class WeightMismatchError(ValueError):
    """Checkpoint tensors do not fit the model built from config.json."""


def load_into(module: nn.Module, tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Copy tensors into `module`'s parameters by name; returns the names that were loaded."""
    params = dict(module.named_parameters())
    loaded = set()
    for name, tensor in tensors:
        param = params.get(name)
        if param is None:
            continue
        if param.shape != tensor.shape:
            raise WeightMismatchError(f"{name}: checkpoint shape {tuple(tensor.shape)}, model expects "
                                      f"{tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        loaded.add(name)
    return loaded


def strip_prefixes(tensors: Iterable[tuple[str, torch.Tensor]], prefixes: tuple[str, ...]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in tensors:
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        yield name, tensor
