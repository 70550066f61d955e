"""Checkpoint tensors that hold several logical parts back to back, each split by TP on its own (the recurrent
mixers' in_proj — z, x, B, C, dt — their convolution over x·B·C or q·k·v, and per-head vectors): a rank keeps its
rows of every part, concatenated, as vLLM's MergedColumnParallelLinear and its sharded Mamba weights do.

- `StackedColumnLinear`: a ColumnParallelLinear whose one checkpoint tensor holds all its parts.
- `ShardedRows`: plain parameters (a depthwise convolution's weight and bias, a norm's groups) read the same way.
- `HeadVectors`: a module's own per-head parameters (dt_bias, A_log, D), this rank's heads."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.layers.linear import ColumnParallelLinear, LoadError, Part


def _starts(parts: list[Part]) -> list[int]:
    """Where each part begins in the checkpoint tensor: after the whole of the parts before it."""
    return [sum(p.total for p in parts[:i]) for i in range(len(parts))]


class StackedColumnLinear(ColumnParallelLinear):
    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind, _ in super().expected()}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        if tensor.shape[0] != sum(p.total for p in self.parts):
            raise LoadError(f"{tensor.name}: checkpoint shape {tensor.shape}, expected "
                            f"{sum(p.total for p in self.parts)} rows")
        for index, start in enumerate(_starts(self.parts)):
            super().load(kind, tensor, index, start)


class ShardedRows(nn.Module):
    """Parameters named `kinds`, each this rank's rows of `parts` (trailing dimensions whole)."""

    weight: nn.Parameter  # every user has one (registered with the other kinds below)

    def __init__(self, parts: list[Part], kinds: dict[str, tuple[int, ...]], fill: float = 0.0) -> None:
        super().__init__()
        self.parts = parts
        rows = sum(p.size for p in parts)
        for kind, trailing in kinds.items():
            self.register_parameter(kind, nn.Parameter(torch.full((rows, *trailing), fill)))
        self.kinds = tuple(kinds)

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind in self.kinds}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        target = getattr(self, kind)
        if tensor.shape[0] != sum(p.total for p in self.parts) or tuple(tensor.shape[1:]) != tuple(target.shape[1:]):
            raise LoadError(f"{tensor.name}: checkpoint shape {tuple(tensor.shape)}, expected "
                            f"{(sum(p.total for p in self.parts), *target.shape[1:])}")
        with torch.no_grad():
            target.copy_(rows_of(tensor, self.parts))


def rows_of(tensor: CheckpointTensor, parts: list[Part]) -> torch.Tensor:
    """This rank's rows of each part of a tensor that holds them back to back, concatenated."""
    return torch.cat([tensor.read(0, start + p.start, start + p.start + p.size)
                      for p, start in zip(parts, _starts(parts))])


class HeadVectors:
    """For a module whose own parameters named `head_vectors` hold one value per head: it loads this rank's heads
    (`head_part`) of each and says they are expected."""

    head_vectors: tuple[str, ...] = ()
    head_part: Part

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind in self.head_vectors}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        with torch.no_grad():
            getattr(self, kind).copy_(rows_of(tensor, [self.head_part]))
