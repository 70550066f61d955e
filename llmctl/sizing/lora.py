"""LoRA slots: which projections an adapter may target, and what `--max-loras` slots cost.

The engine keeps the A/B weights of up to --max-loras adapters resident, stacked per fused
linear of every decoder layer, sized for --max-lora-rank whatever the adapters loaded so
far use (vLLM allocates its LoRA buffers the same way, so any adapter fits any free slot):

    A: [max_loras, slices × max_rank, in]     B: [max_loras, slices × max_rank, out]

where a fused linear (QKV, gate/up) has one slice per projection it fuses, packed so that an
adapter's delta over all of them is two GEMMs (B holds each slice's rows in its own output
columns, zeros elsewhere). `llmctl plan --max-loras N --max-lora-rank R` and the engine's
allocation both count from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import LlmctlError
from llmctl.sizing.weights import kv_heads_per_rank


@dataclass(frozen=True)
class LoRATarget:
    """One fused linear of a decoder layer, as LoRA slots see it (sizes on one TP rank)."""

    module: str  # under each decoder layer, e.g. "self_attn.qkv_proj"
    slices: tuple[str, ...]  # the PEFT module names it fuses, in output order, e.g. ("q_proj", "k_proj", "v_proj")
    in_features: int
    slice_outs: tuple[int, ...]  # output rows of each slice

    def slot_elements(self, max_rank: int) -> int:
        """A and B of one slot: every slice's rows, over the input (A) and over all outputs (B)."""
        return len(self.slices) * max_rank * (self.in_features + sum(self.slice_outs))


def lora_targets(spec: ModelSpec, tp: int = 1) -> list[LoRATarget]:
    """The projections of a dense decoder layer, as one TP rank holds them.

    Column-parallel layers (QKV, gate/up) keep their full input and a slice of the outputs;
    row-parallel ones (o, down) a slice of the input and the full outputs."""
    att, h = spec.attention, spec.hidden_size
    if att.kind == "MLA" or spec.moe is not None:
        raise LlmctlError(f"LoRA slots are counted for dense attention and MLP layers; {spec.model_type} has "
                          f"{'MLA attention' if att.kind == 'MLA' else 'mixture-of-experts layers'}")
    q = att.num_heads // tp * att.head_dim
    kv = kv_heads_per_rank(spec, tp) * att.head_dim
    inter = spec.intermediate_size // tp
    mlp = [LoRATarget("mlp.gate_up_proj", ("gate_proj", "up_proj"), h, (inter, inter)),
           LoRATarget("mlp.down_proj", ("down_proj",), inter, (h,))] if spec.layout.gated_mlp else \
        [LoRATarget("mlp.fc1", ("fc1",), h, (inter,)), LoRATarget("mlp.fc2", ("fc2",), inter, (h,))]
    return [LoRATarget("self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj"), h, (q, kv, kv)),
            LoRATarget("self_attn.o_proj", ("o_proj",), q, (h,))] + mlp


def lora_slot_bytes(spec: ModelSpec, max_loras: int, max_rank: int, dtype_bytes: int, tp: int = 1,
                    num_layers: int | None = None) -> int:
    """Bytes of the resident LoRA slots on one rank holding `num_layers` decoder layers (default: all)."""
    layers = spec.num_layers if num_layers is None else num_layers
    per_layer = sum(target.slot_elements(max_rank) for target in lora_targets(spec, tp))
    return max_loras * per_layer * layers * dtype_bytes
