"""An EAGLE-3 draft head in its published layout (EAGLE's own checkpoints, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B,
and the speculators format: `fc`, one `midlayer` / `layers.0` decoder layer, `norm`, `lm_head`, `d2t`), run as
vLLM runs it: the target's residual stream entering three of its layers, concatenated ([T, 3H]), goes through
`fc` to H; the layer's attention reads the token's embedding and that hidden state side by side ([T, 2H]); its
output before the final norm is the hidden state of the next chained step; the logits are over the head's own
vocabulary, each id mapped to the target's by `d2t` (target id = draft id + d2t[draft id])."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.weights import iterate_tensors
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.models.common import StepContext
from llmctl.engine.spec_decode.hidden_proposer import HEAD_LAYER


@dataclass(frozen=True)
class Eagle3Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    draft_vocab: int
    aux_layers: tuple[int, ...]  # the target layers whose input is read
    norm_before_residual: bool = False  # the speculators format's option: the residual is the normed hidden state

    @staticmethod
    def of(hf_config: Any, target_layers: int) -> Eagle3Shape:
        heads = hf_config.num_attention_heads
        aux = getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None) or \
            (2, target_layers // 2, target_layers - 3)  # vLLM's default: low, middle and high
        return Eagle3Shape(hf_config.hidden_size, heads, getattr(hf_config, "num_key_value_heads", heads),
                           getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
                           hf_config.intermediate_size, float(getattr(hf_config, "rms_norm_eps", 1e-6)),
                           getattr(hf_config, "draft_vocab_size", None) or hf_config.vocab_size, tuple(aux),
                           bool(getattr(hf_config, "norm_before_residual", False)))


class Eagle3Head(nn.Module):
    def __init__(self, shape: Eagle3Shape, hf_config: Any, target_hidden: int, target_vocab: int) -> None:
        super().__init__()
        h, q_size, kv_size = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        self.shape, self.target_vocab = shape, target_vocab
        self.fc = nn.Linear(len(shape.aux_layers) * target_hidden, h, bias=False)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, shape.eps), RMSNorm(h, shape.eps)
        self.q_proj = nn.Linear(2 * h, q_size, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_size, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, h, bias=False)
        self.rotary = RotaryEmbedding(hf_config, shape.head_dim)
        self.post_attention_layernorm = RMSNorm(h, shape.eps)
        self.gate_up_proj = nn.Linear(h, 2 * shape.intermediate, bias=False)
        self.down_proj = nn.Linear(shape.intermediate, h, bias=False)
        self.norm = RMSNorm(h, shape.eps)
        self.lm_head = nn.Linear(h, shape.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
        self.embed_tokens: nn.Module | None = None  # the head's own, when it ships one
        self.target_embed: Any = None  # else the target's embedding (set by the proposer; not a submodule)
        self.prenorm: torch.Tensor | None = None  # the last forward's hidden state before the final norm

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """[T, H] normed output; `hidden`: the target's [T, 3H] auxiliary states, or a chained step's [T, H]."""
        assert hidden is not None, "a draft step reads the target's hidden states or the step before's"
        embeds = self.embed_tokens(input_ids) if self.embed_tokens is not None else self.target_embed(input_ids)
        if hidden.shape[-1] != self.shape.hidden:
            hidden = self.fc(hidden)
        normed_hidden = self.hidden_norm(hidden)
        residual = (normed_hidden if self.shape.norm_before_residual else hidden).clone()  # summed into in place
        x = torch.cat([self.input_layernorm(embeds), normed_hidden], dim=-1)
        attended, residual = self.post_attention_layernorm.add_and_norm(self._attention(x, ctx), residual)
        mlp = self.down_proj(silu_and_mul(self.gate_up_proj(attended), self.shape.intermediate))
        normed, self.prenorm = self.norm.add_and_norm(mlp, residual)
        return normed

    def _attention(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        s = self.shape
        q = self.q_proj(x).view(-1, s.heads, s.head_dim)
        k = self.k_proj(x).view(-1, s.kv_heads, s.head_dim)
        v = self.v_proj(x).view(-1, s.kv_heads, s.head_dim)
        cache, scale = ctx.kv_caches[HEAD_LAYER], s.head_dim ** -0.5
        if getattr(ctx.backend, "rotates_on_store", False):  # Triton: RoPE inside the KV store's launch
            cos, sin = self.rotary.cos_sin(ctx.positions, q.dtype, ctx.lengths)
            out = ctx.backend.forward_rotated(q, k, v, cos, sin, cache, scale=scale)  # type: ignore[attr-defined]
        else:
            q, k = self.rotary(ctx.positions, q, k, ctx.lengths)
            out = ctx.backend.forward(q, k, v, cache, scale=scale)
        return self.o_proj(out.reshape(-1, s.heads * s.head_dim))

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[N, target vocab]: the head's logits at their target ids, -inf where the head has none."""
        draft = self.lm_head(normed).float()
        logits = draft.new_full((draft.shape[0], self.target_vocab), float("-inf"))
        logits[:, torch.arange(self.shape.draft_vocab, device=draft.device) + self.draft_to_target] = draft
        return logits

    @property
    def draft_to_target(self) -> torch.Tensor:
        d2t = self.d2t
        assert isinstance(d2t, torch.Tensor), "a registered buffer"
        return d2t

    def load(self, folder: Any, dtype: torch.dtype, allow_pickle: bool) -> None:
        """The published names (EAGLE's `midlayer.`, the speculators format's `layers.0.`, either under `model.`)."""
        params = dict(self.named_parameters()) | dict(self.named_buffers())
        seen, gate_up = set(), {}
        for tensor in iterate_tensors(folder, dtype, allow_pickle):
            name = _our_name(tensor.name)
            if name in ("gate_proj.weight", "up_proj.weight"):
                gate_up[name] = tensor.read()
                continue
            if name == "t2d":  # the reverse map (which target ids the head has): d2t says the same
                continue
            if name == "embed_tokens.weight":
                self.embed_tokens = nn.Embedding.from_pretrained(tensor.read(), freeze=True)
                continue
            if name not in params or params[name].shape != torch.Size(tensor.shape):
                raise SpeculativeConfigError(f"the EAGLE-3 head's tensor {tensor.name} {list(tensor.shape)} is not "
                                             "in the published layout (fc, midlayer.*, norm, lm_head, d2t)")
            with torch.no_grad():
                params[name].copy_(tensor.read())
            seen.add(name)
        if len(gate_up) == 2:
            with torch.no_grad():
                self.gate_up_proj.weight.copy_(torch.cat([gate_up["gate_proj.weight"], gate_up["up_proj.weight"]]))
            seen.add("gate_up_proj.weight")
        missing = sorted(set(params) - seen - {"rotary.inv_freq", "d2t"} - {n for n in params if n.startswith("rotary.")})
        if missing:
            raise SpeculativeConfigError(f"the EAGLE-3 head lacks {', '.join(missing)}: is it an EAGLE-3 checkpoint?")


def _our_name(name: str) -> str:
    name = name.removeprefix("model.")
    for prefix in ("midlayer.", "layers.0."):
        if name.startswith(prefix):
            name = name.removeprefix(prefix)
            return name.removeprefix("self_attn.").removeprefix("mlp.")
    return name
