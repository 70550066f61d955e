"""Phi-3, Phi-3.5 and Phi-4-mini: the Llama network with q, k and v stored as one `qkv_proj` tensor
and gate and up as one `gate_up_proj` (split here into each rank's rows), partial rotary and
LongRoPE (both in llmctl.engine.layers.positions)."""

from __future__ import annotations

from llmctl.engine.models.common import Target, layer_index
from llmctl.engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    supports_lora = False  # PEFT names Phi-3's fused qkv_proj / gate_up_proj, which llmctl's LoRA does not map yet

    def targets(self, name: str) -> list[Target]:
        stripped = name.removeprefix("model.")
        layer = layer_index(stripped, "layers.")
        fused = self._fused_rows(stripped)
        if layer is None or fused is None:
            return super().targets(name)
        if layer not in self.stage_layers:
            return []
        return [Target(stripped, part, offset) for part, offset in enumerate(fused)]

    def _fused_rows(self, name: str) -> list[int] | None:
        """The first checkpoint row of each part of a fused tensor (q, k, v or gate, up)."""
        att = self.spec.attention
        if ".self_attn.qkv_proj." in name:
            q, kv = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
            return [0, q, q + kv]
        if ".mlp.gate_up_proj." in name:
            return [0, self.spec.intermediate_size]
        return None
