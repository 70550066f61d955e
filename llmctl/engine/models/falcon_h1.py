"""Falcon-H1 (`FalconH1ForCausalLM`): in every layer a Mamba2 mixer and Llama's attention read the same normed input
side by side and their outputs are summed into the residual, then a SwiGLU MLP — with µP multipliers throughout:
the embeddings, the mixer's input and in_proj's z, x, B, C, dt rows (`ssm_in_multiplier`, `ssm_multipliers`), its
output (`ssm_out_multiplier`), the attention's input, keys and output (`attention_in_multiplier`, `key_multiplier`,
`attention_out_multiplier`), the MLP's gate and output (`mlp_multipliers`) and the logits (`lm_head_multiplier`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.mamba2_mixer import Mamba2Mixer
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext, Target
from llmctl.engine.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, Multipliers


class ScaledMLP(LlamaMLP):
    """SwiGLU with the gate × gate_scale inside the SiLU and the output × down_scale."""

    def __init__(self, spec: ModelSpec, group: TPGroup, gate_scale: float, down_scale: float) -> None:
        super().__init__(spec.hidden_size, spec.intermediate_size, spec.layout.mlp_bias, group, spec.quantization)
        self.gate_scale, self.down_scale = gate_scale, down_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.gate_up_proj(x)
        if self.gate_scale != 1.0:
            fused = torch.cat([fused[:, :self.intermediate] * self.gate_scale, fused[:, self.intermediate:]], dim=-1)
        out = self.down_proj(silu_and_mul(fused, self.intermediate))
        return out * self.down_scale if self.down_scale != 1.0 else out


class FalconH1Layer(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: RotaryEmbedding, eps: float, group: TPGroup, hf_config: Any) -> None:
        super().__init__()
        assert isinstance(spec.mixer, Mamba2MixerSpec)
        self.input_layernorm = RMSNorm(spec.hidden_size, eps)
        self.pre_ff_layernorm = RMSNorm(spec.hidden_size, eps)
        self.mamba = Mamba2Mixer(spec.mixer, eps, group, spec.quantization)
        # keys × key_multiplier scale every logit by it: folded into the softmax scale, the cache keeps plain keys
        scale = float(getattr(hf_config, "key_multiplier", 1.0) or 1.0) * spec.attention.head_dim ** -0.5
        self.self_attn = LlamaAttention(spec, rotary, eps, group, scale)
        gate_scale, down_scale = (float(m) for m in getattr(hf_config, "mlp_multipliers", None) or (1.0, 1.0))
        self.feed_forward = ScaledMLP(spec, group, gate_scale, down_scale)
        self.ssm_out = float(getattr(hf_config, "ssm_out_multiplier", 1.0) or 1.0)
        self.attention_in = float(getattr(hf_config, "attention_in_multiplier", 1.0) or 1.0)
        self.attention_out = float(getattr(hf_config, "attention_out_multiplier", 1.0) or 1.0)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        assert ctx.states is not None
        h = self.input_layernorm(x)
        mixed = self.mamba(h, ctx.states, layer) * self.ssm_out
        attended = self.self_attn(h * self.attention_in, ctx, layer) * self.attention_out
        x = x + mixed + attended
        return x + self.feed_forward(self.pre_ff_layernorm(x))


class FalconH1ForCausalLM(LlamaForCausalLM):
    supports_lora = False  # PEFT's targets in the Mamba mixers (in_proj, out_proj) have no LoRA slots

    def __init__(self, spec: ModelSpec, hf_config: Any, shard=None) -> None:
        super().__init__(spec, hf_config, shard)
        self.multipliers = Multipliers(embedding=float(getattr(hf_config, "embedding_multiplier", 1.0) or 1.0),
                                       logits=1.0 / float(getattr(hf_config, "lm_head_multiplier", 1.0) or 1.0))

    def make_layer(self, index: int, hf_config: Any, rotary: RotaryEmbedding, eps: float) -> nn.Module:
        return FalconH1Layer(self.spec, rotary, eps, self.shard.group, hf_config)

    def targets(self, name: str) -> list[Target]:
        return super().targets(name.replace("model.final_layernorm.", "model.norm.", 1))
