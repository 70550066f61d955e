"""gpt-oss's routed experts: FusedMoE's grouping with biases on both projections and a clamped SwiGLU,
(clamp(up, ±limit) + 1) · g · σ(α · g) with g = min(gate, limit) — transformers' GptOssExperts.

The checkpoint keeps each layer's experts as three-dimensional tensors, gate and up interleaved by column:
gate_up_proj [E, H, 2I] (even columns gate, odd ones up), gate_up_proj_bias [E, 2I], down_proj [E, I, H],
down_proj_bias [E, H]. They are read into FusedMoE's stacked layout (w13 [E, 2I, H] gate rows then up rows,
w2 [E, H, I]), so the CPU's packed GEMMs, tensor parallelism (a slice of every expert's I) and expert
parallelism (whole experts per rank) work as for the other families. The down projection's bias is added once:
by the rank holding the expert whole, or by TP rank 0 where every rank holds a slice of it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.linear import LoadError
from llmctl.engine.layers.moe import FusedMoE, Routing, grouped_experts, route

CHECKPOINT_KINDS = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")


def clamped_swiglu(fused: torch.Tensor, intermediate: int, alpha: float, limit: float) -> torch.Tensor:
    """fused [T, 2I] (gate then up) -> [T, I], in float32 as the clamps and σ need it, back in fused's dtype."""
    gate = fused[:, :intermediate].float().clamp(max=limit)
    up = fused[:, intermediate:].float().clamp(min=-limit, max=limit)
    return ((up + 1) * gate * torch.sigmoid(gate * alpha)).to(fused.dtype)


class ClampedSwigluExperts(FusedMoE):
    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None, alpha: float, limit: float) -> None:
        super().__init__(num_experts, hidden, intermediate, routing, group, experts)
        local = len(self.local_experts)
        self.w13_bias = nn.Parameter(torch.empty(local, 2 * self.part.size), requires_grad=False)
        self.w2_bias = nn.Parameter(torch.empty(local, hidden), requires_grad=False)
        self.alpha, self.limit = alpha, limit
        self.adds_down_bias = experts is not None or group.rank == 0

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind in CHECKPOINT_KINDS}

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        """A whole layer's tensor of one kind: this rank's experts, and its slice of each one's I."""
        if kind not in CHECKPOINT_KINDS:
            raise LoadError(f"{tensor.name}: gpt-oss experts hold {', '.join(CHECKPOINT_KINDS)}, not {kind}")
        if tensor.shape[0] != self.num_experts:
            raise LoadError(f"{tensor.name}: {tensor.shape[0]} experts in the checkpoint, {self.num_experts} in config")
        ours = tensor.read(0, self.first_expert, self.first_expert + len(self.local_experts))
        p = self.part
        rows = slice(p.start, p.start + p.size)
        with torch.no_grad():
            if kind == "gate_up_proj":  # [e, H, 2I] -> gate rows then up rows of [e, 2I', H]
                self.w13.copy_(torch.cat([ours[..., 0::2][..., rows], ours[..., 1::2][..., rows]], -1).transpose(1, 2))
            elif kind == "gate_up_proj_bias":
                self.w13_bias.copy_(torch.cat([ours[..., 0::2][..., rows], ours[..., 1::2][..., rows]], -1))
            elif kind == "down_proj":  # [e, I, H] -> [e, H, I']
                self.w2.copy_(ours[:, rows].transpose(1, 2))
            else:
                self.w2_bias.copy_(ours)

    def _own_experts(self, x: torch.Tensor, router_logits: torch.Tensor,
                     correction_bias: torch.Tensor | None) -> torch.Tensor:
        weights, ids = route(router_logits, self.routing)
        return grouped_experts(x, weights, ids, len(self.local_experts), self._project(), self.first_expert)

    def _project(self) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Local expert i's biased, clamped MLP (through the packed CPU weights where there are some)."""
        size = self.part.size

        def project(expert: int, chunk: torch.Tensor) -> torch.Tensor:
            pair = self.packed_experts[expert] if self.packed_experts else (None, None)
            fused = cpu_gemm.linear(chunk, self.w13[expert], pair[0], self.w13_bias[expert])
            gated = clamped_swiglu(fused, size, self.alpha, self.limit)
            return cpu_gemm.linear(gated, self.w2[expert], pair[1], self.w2_bias[expert] if self.adds_down_bias else None)
        return project
