"""EAGLE-1/2 heads for tests, saved in EAGLE's published layout (`fc` with its bias, one Llama decoder layer
`layers.0.*` with no input norm, a copy of the target's `embed_tokens`; the target's config with one layer), and the
head's first draft computed from its definition with transformers' own one-layer LlamaModel (its input and final
norms taken out, full causal attention, no cache) over the target's final hidden states."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PROMPT = [1, 450, 701, 112, 318, 9, 27, 88, 1000, 4, 5]


def eagle_target(folder: Path, tokenizer):
    """The random 6-layer Llama the EAGLE heads' tests draft for: (its folder, config, transformers' model)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from helpers.models import save_random_model

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512)
    save_random_model(config, folder, tokenizer)
    return folder, config, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def save_eagle_head(folder: Path, target_folder: Path, seed: int, std: float = 0.2, para_norm: bool = False,
                    **config_changes) -> Path:
    """`para_norm`: a HASS head (`add_para_norm`: the embedding and the hidden state each normed before `fc`)."""
    config = json.loads((target_folder / "config.json").read_text())
    h, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = h // heads, config["intermediate_size"]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    target = load_file(str(target_folder / "model.safetensors"))
    tensors = {"fc.weight": rand(h, 2 * h), "fc.bias": rand(h), "embed_tokens.weight": target["model.embed_tokens.weight"],
               "layers.0.self_attn.q_proj.weight": rand(heads * head_dim, h),
               "layers.0.self_attn.k_proj.weight": rand(kv_heads * head_dim, h),
               "layers.0.self_attn.v_proj.weight": rand(kv_heads * head_dim, h),
               "layers.0.self_attn.o_proj.weight": rand(h, heads * head_dim),
               "layers.0.post_attention_layernorm.weight": 1 + rand(h),
               "layers.0.mlp.gate_proj.weight": rand(inter, h), "layers.0.mlp.up_proj.weight": rand(inter, h),
               "layers.0.mlp.down_proj.weight": rand(h, inter)}
    if para_norm:
        tensors |= {"embedding_layernorm.weight": 1 + rand(h), "hidden_states_layernorm.weight": 1 + rand(h)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config | {"architectures": ["LlamaForCausalLM"],
                                                             "num_hidden_layers": 1,
                                                             "add_para_norm": para_norm} | config_changes))
    return folder


def reference_first_draft(target, head_folder: Path, token_ids: list[int]) -> int:
    """EAGLE's next-token guess after `token_ids`: position p reads (token p + 1, the target's output at p)."""
    from transformers import LlamaConfig, LlamaModel

    w = load_file(str(head_folder / "model.safetensors"))
    config = LlamaConfig(**json.loads((head_folder / "config.json").read_text()))
    config._attn_implementation = "sdpa"
    layer = LlamaModel(config).eval()
    layer.load_state_dict({name: t for name, t in w.items() if name.startswith("layers.")}, strict=False)
    layer.layers[0].input_layernorm = torch.nn.Identity()
    layer.norm = torch.nn.Identity()
    with torch.no_grad():
        hidden = target.model(torch.tensor([token_ids])).last_hidden_state[0, :-1]  # after the final norm
        embeds = target.get_input_embeddings()(torch.tensor(token_ids[1:]))
        if config.add_para_norm:
            embeds, hidden = rms(embeds, w["embedding_layernorm.weight"]), rms(hidden, w["hidden_states_layernorm.weight"])
        x = torch.cat([embeds, hidden], dim=-1) @ w["fc.weight"].T + w["fc.bias"]
        out = layer(inputs_embeds=x[None]).last_hidden_state[0, -1]
        return int(target.lm_head(out).argmax())


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
