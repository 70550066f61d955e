"""Phi-3, Phi-3.5 and Phi-4-mini: the Llama network with q, k and v stored as one `qkv_proj` tensor
and gate and up as one `gate_up_proj` (split here into each rank's rows), partial rotary and
LongRoPE (both in llmctl.engine.layers.positions). PEFT adapters train the fused projections whole;
llmctl.engine.lora.adapter splits their B rows into the slices."""

from __future__ import annotations

from llmctl.engine.models.common import Target, layer_index
from llmctl.engine.models.llama import LlamaForCausalLM

FUSED_TENSORS = ("self_attn.qkv_proj", "mlp.gate_up_proj")  # stored fused in Phi-3 checkpoints


class Phi3ForCausalLM(LlamaForCausalLM):
    def targets(self, name: str) -> list[Target]:
        stripped = name.removeprefix("model.")
        layer = layer_index(stripped, "layers.")
        if layer is None or not any(f".{fused}." in stripped for fused in FUSED_TENSORS):
            return super().targets(name)
        return self.stacked_targets(stripped) if layer in self.stage_layers else []
