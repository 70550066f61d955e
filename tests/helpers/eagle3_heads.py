"""EAGLE-3 heads for tests, saved in the published layout (EAGLE's `midlayer.*` names, `d2t`/`t2d`, a Llama
config whose architecture is LlamaForCausalLMEagle3), and EAGLE-3's first draft computed in plain torch from its
definition (the target's hidden states from transformers' output_hidden_states, full causal attention, no cache):
the reference a paged, incremental head is checked against."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

AUX_LAYERS = (2, 3, 3)  # vLLM's default for a 6-layer target: 2, layers // 2, layers - 3


def save_eagle3_head(folder: Path, target_config, draft_ids: list[int], seed: int, std: float = 0.2) -> Path:
    """A random head over `draft_ids` of the target's vocabulary."""
    h, heads, kv_heads = target_config.hidden_size, target_config.num_attention_heads, target_config.num_key_value_heads
    head_dim, inter = h // heads, 128
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    tensors = {"fc.weight": rand(h, 3 * h), "midlayer.input_layernorm.weight": 1 + rand(h),
               "midlayer.hidden_norm.weight": 1 + rand(h), "midlayer.post_attention_layernorm.weight": 1 + rand(h),
               "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * h),
               "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * h),
               "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * h),
               "midlayer.self_attn.o_proj.weight": rand(h, heads * head_dim),
               "midlayer.mlp.gate_proj.weight": rand(inter, h), "midlayer.mlp.up_proj.weight": rand(inter, h),
               "midlayer.mlp.down_proj.weight": rand(h, inter),
               "norm.weight": 1 + rand(h), "lm_head.weight": rand(len(draft_ids), h)}
    ids = torch.tensor(draft_ids)
    tensors["d2t"] = ids - torch.arange(len(draft_ids))
    t2d = torch.zeros(target_config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": inter,
              "num_hidden_layers": 1, "vocab_size": target_config.vocab_size, "draft_vocab_size": len(draft_ids),
              "rms_norm_eps": target_config.rms_norm_eps, "max_position_embeddings": 2048,
              "rope_theta": target_config.rope_parameters["rope_theta"] if getattr(target_config, "rope_parameters", None)
              else 10000.0, "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def reference_first_draft(target, head_folder: Path, token_ids: list[int]) -> int:
    """EAGLE-3's next-token guess after `token_ids` (the target's token at the last position, and everything
    before), from its definition: position p reads (token p + 1, the target's layers' inputs at p)."""
    from safetensors.torch import load_file
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    w = load_file(str(head_folder / "model.safetensors"))
    config = json.loads((head_folder / "config.json").read_text())
    eps, heads, kv_heads = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"]
    with torch.no_grad():
        out = target(torch.tensor([token_ids]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[layer][0, :-1] for layer in AUX_LAYERS], dim=-1)  # positions 0..n-2
        shifted = torch.tensor(token_ids[1:])

        def rms(x: torch.Tensor, name: str) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[name]

        def lin(x: torch.Tensor, name: str) -> torch.Tensor:
            return x @ w[name].T

        hidden = lin(aux, "fc.weight")
        embeds = target.get_input_embeddings()(shifted)
        x = torch.cat([rms(embeds, "midlayer.input_layernorm.weight"), rms(hidden, "midlayer.hidden_norm.weight")], -1)
        n, head_dim = x.shape[0], config["hidden_size"] // heads
        q = lin(x, "midlayer.self_attn.q_proj.weight").view(n, heads, head_dim).transpose(0, 1)
        k = lin(x, "midlayer.self_attn.k_proj.weight").view(n, kv_heads, head_dim).transpose(0, 1)
        v = lin(x, "midlayer.self_attn.v_proj.weight").view(n, kv_heads, head_dim).transpose(0, 1)
        from transformers import LlamaConfig

        cos, sin = LlamaRotaryEmbedding(LlamaConfig(**config))(x, torch.arange(n)[None])
        q, k = apply_rotary_pos_emb(q[None], k[None], cos, sin)
        k, v = k[0].repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        scores = (q[0] @ k.transpose(1, 2)) / head_dim ** 0.5 + torch.full((n, n), float("-inf")).triu(1)
        attended = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
        residual = hidden + lin(attended, "midlayer.self_attn.o_proj.weight")
        y = rms(residual, "midlayer.post_attention_layernorm.weight")
        mlp = lin(torch.nn.functional.silu(lin(y, "midlayer.mlp.gate_proj.weight")) * lin(y, "midlayer.mlp.up_proj.weight"),
                  "midlayer.mlp.down_proj.weight")
        logits = lin(rms(residual + mlp, "norm.weight")[-1], "lm_head.weight")
    draft = int(logits.argmax())
    return draft + int(w["d2t"][draft])
