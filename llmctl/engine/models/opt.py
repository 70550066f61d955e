"""OPT: learned absolute positions (offset 2), pre- or post-LayerNorm, ReLU MLP, tied head."""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.engine.models.common import StepContext, WeightMismatchError, load_into
from llmctl.model.spec import ModelSpec

POSITION_OFFSET = 2  # OPT's position table starts two rows in (fairseq's padding convention)
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}


class OPTAttention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.num_heads, self.head_dim = spec.attention.num_heads, spec.attention.head_dim
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.out_proj = nn.Linear(h, h)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, ctx: StepContext, layer: int) -> torch.Tensor:
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        out = ctx.backend.forward(q, k, v, ctx.kv_caches[layer], scale=self.scale)
        return self.out_proj(out.reshape(x.shape[0], -1))


class OPTDecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, hf_config: Any) -> None:
        super().__init__()
        h = spec.hidden_size
        self.pre_norm = bool(getattr(hf_config, "do_layer_norm_before", True))
        self.self_attn = OPTAttention(spec)
        self.self_attn_layer_norm = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, spec.intermediate_size)
        self.fc2 = nn.Linear(spec.intermediate_size, h)
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
    def __init__(self, spec: ModelSpec, hf_config: Any) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden_size
        embed_dim = int(getattr(hf_config, "word_embed_proj_dim", h) or h)
        self.embed_tokens = nn.Embedding(spec.vocab_size, embed_dim)
        self.embed_positions = nn.Embedding(spec.positional.learned_positions, h)
        self.project_in = nn.Linear(embed_dim, h, bias=False) if embed_dim != h else None
        self.project_out = nn.Linear(h, embed_dim, bias=False) if embed_dim != h else None
        self.layers = nn.ModuleList(OPTDecoderLayer(spec, hf_config) for _ in range(spec.num_layers))
        keep_final = getattr(hf_config, "do_layer_norm_before", True) and \
            not getattr(hf_config, "_remove_final_layer_norm", False)
        self.final_layer_norm = nn.LayerNorm(h) if keep_final else None

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.embed_positions(ctx.positions + POSITION_OFFSET)
        for index, layer in enumerate(self.layers):
            x = layer(x, ctx, index)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed_tokens.weight.t()

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        renamed = ((name.removeprefix("model.").removeprefix("decoder."), t) for name, t in tensors)
        loaded = load_into(self, renamed)
        missing = {n for n, _ in self.named_parameters()} - loaded
        if missing:
            raise WeightMismatchError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
