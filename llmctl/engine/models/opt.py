"""OPT: learned absolute positions (offset 2), pre- or post-LayerNorm, ReLU MLP, tied head."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear, VocabParallelEmbedding
from llmctl.engine.models.common import (
    Shard,
    StepContext,
    Target,
    embedding_targets,
    layer_index,
    load_checkpoint,
)

POSITION_OFFSET = 2  # OPT's position table starts two rows in (fairseq's padding convention)
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}
QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}


class OPTAttention(nn.Module):
    def __init__(self, spec: ModelSpec, group: TPGroup) -> None:
        super().__init__()
        h = spec.hidden_size
        part = Part.split(h, group)
        self.num_heads, self.head_dim = spec.attention.num_heads // group.size, spec.attention.head_dim
        self.qkv_proj = ColumnParallelLinear(h, [part, part, part], True)
        self.out_proj = RowParallelLinear(part, h, True, group)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = (t.reshape(shape) for t in self.qkv_proj(x).chunk(3, dim=-1))
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale)
        return self.out_proj(out.reshape(x.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any, group: TPGroup) -> None:
        super().__init__()
        h = spec.hidden_size
        self.pre_norm = bool(getattr(hf_config, "do_layer_norm_before", True))
        self.self_attn = OPTAttention(spec, group)
        self.self_attn_layer_norm = nn.LayerNorm(h)
        ffn = Part.split(spec.intermediate_size, group)
        self.fc1 = ColumnParallelLinear(h, [ffn], True)
        self.fc2 = RowParallelLinear(ffn, h, True, group)
        self.final_layer_norm = nn.LayerNorm(h)
        self.act = ACTIVATIONS[getattr(hf_config, "activation_function", "relu")]

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        attn_in = self.self_attn_layer_norm(x) if self.pre_norm else x
        x = x + self.self_attn(attn_in, ctx, layer)
        if not self.pre_norm:
            x = self.self_attn_layer_norm(x)
        mlp_in = self.final_layer_norm(x) if self.pre_norm else x
        x = x + self.fc2(self.act(self.fc1(mlp_in)))
        return x if self.pre_norm else self.final_layer_norm(x)


class OPTForCausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__()
        shard = shard or Shard()
        self.spec, self.stage_layers = spec, shard.stage_layers(spec.num_layers)
        h, group = spec.hidden_size, shard.group
        embed_dim = int(getattr(hf_config, "word_embed_proj_dim", h) or h)
        first, last = shard.is_first, shard.is_last
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, embed_dim, group) if first else None
        self.embed_positions = nn.Embedding(spec.positional.learned_positions, h) if first else None
        projected = embed_dim != h  # OPT-350m: a small embedding projected in and out, replicated on every rank
        self.project_in = nn.Linear(embed_dim, h, bias=False) if projected and first else None
        self.project_out = nn.Linear(h, embed_dim, bias=False) if projected and last else None
        self.layers = nn.ModuleList(OPTDecoderLayer(spec, hf_config, group) if i in self.stage_layers
                                    else nn.Identity() for i in range(spec.num_layers))
        keep_final = getattr(hf_config, "do_layer_norm_before", True) and \
            not getattr(hf_config, "_remove_final_layer_norm", False)
        self.final_layer_norm = nn.LayerNorm(h) if keep_final and last else None
        self.lm_head = (self.embed_tokens or VocabParallelEmbedding(spec.vocab_size, embed_dim, group)) \
            if last else None

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(input_ids)
            if self.project_in is not None:
                x = self.project_in(x)
            x = x + self.embed_positions(ctx.positions + POSITION_OFFSET)
        else:
            x = hidden
        for index in self.stage_layers:
            x = self.layers[index](x, ctx, index)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def load_weights(self, tensors: Any) -> None:
        load_checkpoint(self, tensors, self.targets)

    def targets(self, name: str) -> list[Target]:
        name = name.removeprefix("model.").removeprefix("decoder.")
        layer = layer_index(name, "layers.")
        if layer is not None:
            if layer not in self.stage_layers:
                return []
            parts = name.split(".")
            if parts[-2] in QKV:
                return [Target(".".join(parts[:-2] + ["qkv_proj", parts[-1]]), QKV[parts[-2]])]
            return [Target(name)]
        if name == "embed_tokens.weight":
            return embedding_targets(name, self.embed_tokens, self.lm_head, True)
        return [Target(name)]
