"""Nemotron-H's MLPs: no gate, an up projection, ReLU², a down projection — as a dense MLP (its "-" blocks and the
shared expert) and as routed experts (FusedMoE's routing, tensor and expert parallelism; w13 holds each expert's up
rows only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.linear import ColumnParallelLinear, LoadError, Part, RowParallelLinear
from llmctl.engine.layers.moe import FusedMoE, Routing, grouped_experts, route


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


class SquaredReluMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool, group: TPGroup,
                 quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        part = Part.split(intermediate, group)
        self.up_proj = ColumnParallelLinear(hidden, [part], bias, quant)
        self.down_proj = RowParallelLinear(part, hidden, bias, group, quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(relu_squared(self.up_proj(x)))


class SquaredReluExperts(FusedMoE):
    """w13 [E, I, H]: expert e's up_proj is part e (FusedMoE's gated experts hold gate and up as parts 2e, 2e + 1)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None) -> None:
        super().__init__(num_experts, hidden, intermediate, routing, group, experts)
        self.w13 = nn.Parameter(torch.empty(len(self.local_experts), self.part.size, hidden), requires_grad=False)

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, e) for e in self.local_experts for kind in ("w13", "w2")}

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        if kind != "w13":
            return super().load(kind, tensor, part, offset)
        p = self.part
        if tensor.shape[0] != p.total:
            raise LoadError(f"{tensor.name}: checkpoint shape {tensor.shape}, expected {p.total} along dim 0")
        with torch.no_grad():
            self.w13[part - self.first_expert].copy_(tensor.read(0, p.start, p.start + p.size))

    def _own_experts(self, x: torch.Tensor, router_logits: torch.Tensor,
                     correction_bias: torch.Tensor | None) -> torch.Tensor:
        weights, ids = route(router_logits, self.routing, correction_bias)
        return grouped_experts(x, weights, ids, len(self.local_experts), self._project, self.first_expert)

    def _project(self, expert: int, chunk: torch.Tensor) -> torch.Tensor:
        pair = self.packed_experts[expert] if self.packed_experts else (None, None)
        up = cpu_gemm.linear(chunk, self.w13[expert], pair[0])
        return cpu_gemm.linear(relu_squared(up), self.w2[expert], pair[1])
