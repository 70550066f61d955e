"""Mamba2 (Mamba-Codestral, mamba2-*) and Mamba (state-spaces/mamba-*, Falcon-Mamba): every layer a pre-norm
mixer — Mamba2's SSD or Mamba (1)'s selective scan — with its residual, no attention and no MLP; the model keeps no
K/V, only each sequence's state (llmctl.engine.layers.recurrent_state)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.checkpoint.mamba1 import Mamba1MixerSpec
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.linear import VocabParallelEmbedding
from llmctl.engine.layers.mamba1_mixer import Mamba1Mixer
from llmctl.engine.layers.mamba2_mixer import Mamba2Mixer
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.models.common import Shard, StepContext, Target, embedding_targets, layer_index, load_checkpoint


class Mamba2Block(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float, group: TPGroup) -> None:
        super().__init__()
        self.norm = RMSNorm(spec.hidden_size, eps)
        self.mixer: nn.Module
        if isinstance(spec.mixer, Mamba2MixerSpec):
            self.mixer = Mamba2Mixer(spec.mixer, eps, group, spec.quantization)
        else:
            assert isinstance(spec.mixer, Mamba1MixerSpec)
            self.mixer = Mamba1Mixer(spec.mixer, group, spec.quantization)

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        assert ctx.states is not None
        return x + self.mixer(self.norm(x), ctx.states, layer)


class Mamba2ForCausalLM(nn.Module):
    supports_lora = False  # PEFT adapters for Mamba2 target in_proj/out_proj, which LoRA slots do not cover

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__()
        shard = shard or Shard()
        self.spec, self.stage_layers = spec, shard.stage_layers(spec.num_layers)
        eps = float(getattr(hf_config, "layer_norm_epsilon", 1e-5))
        group = shard.group
        self.embeddings = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group) if shard.is_first else None
        self.layers = nn.ModuleList(Mamba2Block(spec, eps, group) if i in self.stage_layers else nn.Identity()
                                    for i in range(spec.num_layers))
        self.norm_f = RMSNorm(spec.hidden_size, eps) if shard.is_last else None
        self.lm_head = None
        if shard.is_last:
            tied_here = spec.tie_word_embeddings and self.embeddings is not None
            self.lm_head = self.embeddings if tied_here else VocabParallelEmbedding(spec.vocab_size,
                                                                                    spec.hidden_size, group)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embeddings(input_ids) if self.embeddings is not None else hidden
        assert x is not None
        for index in self.stage_layers:
            x = self.layers[index](x, ctx, index)
        return self.norm_f(x) if self.norm_f is not None else x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        assert self.lm_head is not None  # the last stage's
        return self.lm_head.logits(hidden)

    def load_weights(self, tensors: Any) -> None:
        load_checkpoint(self, tensors, self.targets)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("backbone.")
        layer = layer_index(name, "layers.")
        if layer is not None:
            return [Target(name)] if layer in self.stage_layers else []
        if name.startswith("embeddings."):
            return embedding_targets(name, self.embeddings, self.lm_head, self.spec.tie_word_embeddings)
        return [Target(name)]
