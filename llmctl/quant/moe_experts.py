"""GPTQ for a mixture of experts' routed experts, expert by expert, as GPTQModel quantizes Mixtral and Qwen-MoE.

transformers 5 holds a layer's experts as two stacked tensors (`experts.gate_up_proj` [E, 2I, H] and
`experts.down_proj` [E, H, I]) run in a loop over the experts the router picked; the checkpoints on disk, and the
GPTQ checkpoints vLLM and GPTQModel read, name each expert's projections apart (`mlp.experts.{e}.gate_proj`,
Mixtral's `block_sparse_moe.experts.{e}.w1`). Each expert is quantized on the calibration tokens the router sent
it: gate and up as one matrix under the Hessian of those tokens, down under the Hessian of what gate and up made
of them. An expert no calibration token reached is rounded to nearest (GPTQ has nothing to weigh its columns by).
The router (and Qwen2-MoE's shared-expert gate) stays 16-bit, as in published GPTQ MoE checkpoints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.quant_formats import QuantizedWeight
from llmctl.quant.gptq import HessianAccumulator, gptq_quantize
from llmctl.quant.rtn import QuantConfig, rtn_quantize

logger = logging.getLogger("llmctl.quant")


@dataclass(frozen=True)
class ExpertNames:
    """Where one layer's experts and router are on disk, relative to the layer's prefix."""

    experts: str  # mlp.experts | block_sparse_moe.experts
    projections: tuple[str, str, str]  # gate, up, down: gate_proj/up_proj/down_proj | w1/w3/w2
    router: str  # mlp.gate.weight | block_sparse_moe.gate.weight

    def expert(self, index: int, projection: int) -> str:
        return f"{self.experts}.{index}.{self.projections[projection]}"

    def disk_name(self, name: str) -> str:
        """A layer parameter's name on disk (the router's differs for Mixtral)."""
        return self.router if name == "mlp.gate.weight" else name


QWEN_NAMES = ExpertNames("mlp.experts", ("gate_proj", "up_proj", "down_proj"), "mlp.gate.weight")
MIXTRAL_NAMES = ExpertNames("block_sparse_moe.experts", ("w1", "w3", "w2"), "block_sparse_moe.gate.weight")
MOE_TYPES = {"qwen2_moe": QWEN_NAMES, "qwen3_moe": QWEN_NAMES, "mixtral": MIXTRAL_NAMES}


def expert_names(model_type: str, layer: nn.Module) -> ExpertNames | None:
    """The layer's expert naming; None for a dense layer (Qwen-MoE's mlp_only_layers too)."""
    return MOE_TYPES.get(model_type) if hasattr(getattr(layer, "mlp", None), "experts") else None


def load_experts(layer: nn.Module, get: Callable[[str], torch.Tensor], prefix: str, names: ExpertNames) -> None:
    """The stacked expert tensors of transformers' layer, filled from the per-expert tensors on disk."""
    mlp: Any = layer.mlp
    experts: Any = mlp.experts  # transformers' experts module: stacked gate_up_proj and down_proj
    with torch.no_grad():
        for e in range(experts.gate_up_proj.shape[0]):
            gate, up, down = (get(prefix + names.expert(e, p) + ".weight") for p in range(3))
            experts.gate_up_proj[e].copy_(torch.cat([gate, up]))
            experts.down_proj[e].copy_(down)


def quantize_experts(layer: nn.Module, hidden: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor],
                     config: QuantConfig, names: ExpertNames, batch: int) -> dict[str, QuantizedWeight]:
    """GPTQ of every routed expert of the layer: {disk name of the projection: its quantized weight}; the
    layer's expert tensors are left holding the dequantized weights."""
    mlp: Any = layer.mlp
    experts: Any = mlp.experts  # transformers' experts module: stacked gate_up_proj and down_proj
    count = experts.gate_up_proj.shape[0]
    inputs = [HessianAccumulator(experts.gate_up_proj.shape[2]) for _ in range(count)]
    middles = [HessianAccumulator(experts.down_proj.shape[2]) for _ in range(count)]

    def capture(module: nn.Module, args: tuple) -> None:
        states, chosen = args[0].detach(), args[1]
        for e in range(count):
            routed = states[(chosen == e).any(dim=-1)]
            if routed.shape[0]:
                inputs[e].add(routed)
                gate, up = (routed @ experts.gate_up_proj[e].t()).chunk(2, dim=-1)
                middles[e].add(experts.act_fn(gate) * up)

    hook = experts.register_forward_pre_hook(capture)
    try:
        for i in range(0, hidden.shape[0], batch):
            run(hidden[i:i + batch])
    finally:
        hook.remove()
    quantized: dict[str, QuantizedWeight] = {}
    unreached = 0
    for e in range(count):
        unreached += inputs[e].count == 0
        quantized.update(_one_expert(experts, e, inputs[e], middles[e], config, names))
    if unreached:
        logger.info("%d of %d experts saw no calibration token: rounded to nearest", unreached, count)
    return quantized


def _one_expert(experts: Any, e: int, inputs: HessianAccumulator, middles: HessianAccumulator,
                config: QuantConfig, names: ExpertNames) -> dict[str, QuantizedWeight]:
    gate_up, down = experts.gate_up_proj[e].detach(), experts.down_proj[e].detach()
    if inputs.count == 0:
        stacked, down_q = rtn_quantize(gate_up, config), rtn_quantize(down, config)
    else:
        stacked, down_q = gptq_quantize(gate_up, inputs.hessian(), config), gptq_quantize(down, middles.hessian(),
                                                                                          config)
    gate_q, up_q = stacked.split_rows([gate_up.shape[0] // 2] * 2)
    with torch.no_grad():
        experts.gate_up_proj[e].copy_(torch.cat([gate_q.dequantize(), up_q.dequantize()]))
        experts.down_proj[e].copy_(down_q.dequantize())
    return {names.expert(e, 0): gate_q, names.expert(e, 1): up_q, names.expert(e, 2): down_q}
