"""Experts stored as whole-layer tensors (gpt-oss, Llama 4): gate_up_proj [E, H, 2I], down_proj [E, I, H] — gate
and up interleaved by column (gpt-oss: even columns gate, odd ones up) or in halves (Llama 4) — read into
FusedMoE's stacked layout (w13 [E, 2I, H] gate rows then up rows, w2 [E, H, I]), so the CPU's packed GEMMs,
tensor parallelism (a slice of every expert's I) and expert parallelism (whole experts per rank) work as for the
other families.

- `StackedExperts`: SiLU-gated experts; Llama 4 weighs each token's input by its router score, not the output
  (`scale_inputs`), which differs since the experts are not linear.
- `ClampedSwigluExperts`: gpt-oss's — biases on both projections (gate_up_proj_bias [E, 2I], down_proj_bias
  [E, H]) and the clamped SwiGLU (clamp(up, ±limit) + 1) · g · σ(α · g), g = min(gate, limit). The down
  projection's bias is added once: by the rank holding the expert whole, or by TP rank 0 where every rank holds
  a slice of it."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.linear import LoadError
from llmctl.engine.layers.moe import FusedMoE, Routing, grouped_experts, route


def clamped_swiglu(fused: torch.Tensor, intermediate: int, alpha: float, limit: float) -> torch.Tensor:
    """fused [T, 2I] (gate then up) -> [T, I], in float32 as the clamps and σ need it, back in fused's dtype."""
    gate = fused[:, :intermediate].float().clamp(max=limit)
    up = fused[:, intermediate:].float().clamp(min=-limit, max=limit)
    return ((up + 1) * gate * torch.sigmoid(gate * alpha)).to(fused.dtype)


class StackedExperts(FusedMoE):
    kinds: tuple[str, ...] = ("gate_up_proj", "down_proj")

    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None, interleaved: bool = False, scale_inputs: bool = False,
                 stacked_weights: bool = True) -> None:
        super().__init__(num_experts, hidden, intermediate, routing, group, experts, stacked_weights=stacked_weights)
        self.interleaved, self.scale_inputs = interleaved, scale_inputs

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind in self.kinds}

    def _gate_and_up(self, fused: torch.Tensor) -> torch.Tensor:
        """[..., 2I] as stored -> [..., 2I'] this rank's gate columns then its up columns."""
        p = self.part
        rows = slice(p.start, p.start + p.size)
        if self.interleaved:
            return torch.cat([fused[..., 0::2][..., rows], fused[..., 1::2][..., rows]], -1)
        gate, up = fused.chunk(2, dim=-1)
        return torch.cat([gate[..., rows], up[..., rows]], -1)

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        """A whole layer's tensor of one kind: this rank's experts, and its slice of each one's I."""
        if kind not in self.kinds:
            raise LoadError(f"{tensor.name}: these experts hold {', '.join(self.kinds)}, not {kind}")
        if tensor.shape[0] != self.num_experts:
            raise LoadError(f"{tensor.name}: {tensor.shape[0]} experts in the checkpoint, {self.num_experts} in config")
        ours = tensor.read(0, self.first_expert, self.first_expert + len(self.local_experts))
        with torch.no_grad():
            self._store(kind, ours)

    def _store(self, kind: str, ours: torch.Tensor) -> None:
        if kind == "gate_up_proj":  # [e, H, 2I] -> [e, 2I', H]
            self.w13.copy_(self._gate_and_up(ours).transpose(1, 2))
        else:  # down_proj [e, I, H] -> [e, H, I']
            self.w2.copy_(ours[:, self.part.start:self.part.start + self.part.size].transpose(1, 2))

    def _own_experts(self, x: torch.Tensor, router_logits: torch.Tensor,
                     correction_bias: torch.Tensor | None) -> torch.Tensor:
        weights, ids = route(router_logits, self.routing)
        if x.is_cuda:  # one grouped GEMM launch per projection (llmctl.kernels.fused_moe)
            from llmctl.kernels.fused_moe import fused_moe

            return fused_moe(x, weights, ids, self.w13, self.w2, self.first_expert, **self.fused_options())
        return grouped_experts(x, weights, ids, len(self.local_experts), self._project(), self.first_expert,
                               self.scale_inputs)

    def fused_options(self) -> dict[str, object]:
        """How fused_moe runs these experts: Llama 4 weighs their inputs."""
        return {"scale_inputs": self.scale_inputs}

    def _project(self) -> Callable[[int, torch.Tensor], torch.Tensor]:
        size = self.part.size

        def project(expert: int, chunk: torch.Tensor) -> torch.Tensor:
            pair = self.packed_experts[expert] if self.packed_experts else (None, None)
            gated = silu_and_mul(cpu_gemm.linear(chunk, self.w13[expert], pair[0]), size)
            return cpu_gemm.linear(gated, self.w2[expert], pair[1])
        return project


class ClampedSwigluExperts(StackedExperts):
    kinds: tuple[str, ...] = ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")

    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None, alpha: float, limit: float, stacked_weights: bool = True) -> None:
        super().__init__(num_experts, hidden, intermediate, routing, group, experts, interleaved=True,
                         stacked_weights=stacked_weights)
        local = len(self.local_experts)
        self.w13_bias = nn.Parameter(torch.empty(local, 2 * self.part.size), requires_grad=False)
        self.w2_bias = nn.Parameter(torch.empty(local, hidden), requires_grad=False)
        self.alpha, self.limit = alpha, limit
        self.adds_down_bias = experts is not None or group.rank == 0

    def _store(self, kind: str, ours: torch.Tensor) -> None:
        if kind == "gate_up_proj_bias":
            self.w13_bias.copy_(self._gate_and_up(ours))
        elif kind == "down_proj_bias":
            self.w2_bias.copy_(ours)
        else:
            super()._store(kind, ours)

    def fused_options(self) -> dict[str, object]:
        """gpt-oss's biases (the down one where this rank adds it) and clamped SwiGLU, in the fused kernel."""
        return {"biases": (self.w13_bias, self.w2_bias if self.adds_down_bias else None),
                "activation": partial(clamped_swiglu, intermediate=self.part.size, alpha=self.alpha, limit=self.limit)}

    def _project(self) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """Local expert i's biased, clamped MLP (through the packed CPU weights where there are some)."""
        size = self.part.size

        def project(expert: int, chunk: torch.Tensor) -> torch.Tensor:
            pair = self.packed_experts[expert] if self.packed_experts else (None, None)
            fused = cpu_gemm.linear(chunk, self.w13[expert], pair[0], self.w13_bias[expert])
            gated = clamped_swiglu(fused, size, self.alpha, self.limit)
            return cpu_gemm.linear(gated, self.w2[expert], pair[1], self.w2_bias[expert] if self.adds_down_bias else None)
        return project
