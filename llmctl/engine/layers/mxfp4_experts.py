"""gpt-oss's experts kept as published on GPUs: MXFP4 blocks (two E2M1 codes a byte) and E8M0 scales (one per 32
inputs) — 4.25 bits a weight, where dequantizing at load (llmctl.checkpoint.mxfp4, what CPUs do) takes 16. The
fused-MoE kernel decodes them tile by tile in registers (kernels/fused_moe.py, MXFP4); biases and the clamped
SwiGLU are ClampedSwigluExperts'.

Checkpoint layout, rows being outputs: gate_up_proj_blocks [E, 2I, H / 32, 16] with gate and up rows interleaved
(even rows gate, odd rows up), down_proj_blocks [E, H, I / 32, 16]. Tensor parallelism takes each rank's gate rows
then its up rows of gate_up, and its slice of down's inputs — whole 32-input groups, so I / TP must be a multiple
of 32 (expert parallelism has no such limit)."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.moe import Routing, route
from llmctl.engine.layers.stacked_experts import ClampedSwigluExperts
from llmctl.errors import UnsupportedModelError
from llmctl.sizing.weights import mxfp4_split_problem

GROUP = 32  # inputs per E8M0 scale


class Mxfp4Experts(ClampedSwigluExperts):
    kinds: tuple[str, ...] = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias",
                              "down_proj_blocks", "down_proj_scales", "down_proj_bias")

    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None, alpha: float, limit: float) -> None:
        super().__init__(num_experts, hidden, intermediate, routing, group, experts, alpha, limit,
                         stacked_weights=False)
        size = self.part.size
        if experts is None and (why := mxfp4_split_problem(intermediate, group.size)):
            raise UnsupportedModelError(why)
        local = len(self.local_experts)

        def codes(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(local, *shape, dtype=torch.uint8), requires_grad=False)

        self.w13_blocks, self.w13_scales = codes(2 * size, hidden // GROUP, 16), codes(2 * size, hidden // GROUP)
        self.w2_blocks, self.w2_scales = codes(hidden, size // GROUP, 16), codes(hidden, size // GROUP)

    def _store(self, kind: str, ours: torch.Tensor) -> None:
        p = self.part
        if kind.startswith("gate_up_proj_") and kind != "gate_up_proj_bias":  # rows interleaved gate, up
            rows = slice(p.start, p.start + p.size)
            mine = torch.cat([ours[:, 0::2][:, rows], ours[:, 1::2][:, rows]], dim=1)
            (self.w13_blocks if kind.endswith("blocks") else self.w13_scales).copy_(mine)
        elif kind.startswith("down_proj_") and kind != "down_proj_bias":  # this rank's groups of inputs
            groups = slice(p.start // GROUP, (p.start + p.size) // GROUP)
            (self.w2_blocks if kind.endswith("blocks") else self.w2_scales).copy_(ours[:, :, groups])
        else:
            super()._store(kind, ours)

    def _own_experts(self, x: torch.Tensor, router_logits: torch.Tensor,
                     correction_bias: torch.Tensor | None) -> torch.Tensor:
        """Always the fused kernel: this form is built only where it runs (GPUs; the interpreter in the tests)."""
        from llmctl.kernels.fused_moe import Mxfp4Weights, fused_moe

        weights, ids = route(router_logits, self.routing)
        return fused_moe(x, weights, ids, Mxfp4Weights(self.w13_blocks, self.w13_scales),
                         Mxfp4Weights(self.w2_blocks, self.w2_scales), self.first_expert, **self.fused_options())
