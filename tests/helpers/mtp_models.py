"""Tiny random DeepSeek-V3 and GLM-4.5 models with one multi-token-prediction layer in their checkpoints (the names
both publish: `model.layers.{num_hidden_layers}.{enorm,hnorm,eh_proj,shared_head.*}` and the layer's own attention
and experts), and the MTP layer's first draft computed from its definition (vLLM's DeepSeekMultiTokenPredictorLayer,
Glm4MoeMultiTokenPredictorLayer) with transformers' own decoder layer of the family as its block and transformers'
hidden states, no cache."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers.families import save_routed_moe


def tiny_v3_config(vocab: int):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(vocab_size=vocab, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                            max_position_embeddings=256, intermediate_size=96, moe_intermediate_size=32,
                            num_hidden_layers=3, first_k_dense_replace=1, n_shared_experts=1, kv_lora_rank=32,
                            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, q_lora_rank=48, n_routed_experts=8,
                            num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
                            routed_scaling_factor=2.5, num_nextn_predict_layers=1)


def tiny_glm4_moe_config(vocab: int):
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=256, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True,
                         n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2,
                         norm_topk_prob=True, routed_scaling_factor=2.5, first_k_dense_replace=1,
                         num_nextn_predict_layers=1)


def _family(config):
    """(transformers' decoder layer, rotary embedding) of the config's family."""
    if config.model_type == "glm4_moe":
        from transformers.models.glm4_moe import modeling_glm4_moe as glm

        return glm.Glm4MoeDecoderLayer, glm.Glm4MoeRotaryEmbedding
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    return v3.DeepseekV3DecoderLayer, v3.DeepseekV3RotaryEmbedding


def mtp_block(config):
    """transformers' decoder layer in the MTP layer's place (index num_hidden_layers: experts, as the releases')."""
    config._attn_implementation = "eager"
    return _family(config)[0](config, config.num_hidden_layers).eval()


def save_v3_with_mtp(folder: Path, tokenizer) -> Path:
    return save_with_mtp(tiny_v3_config(len(tokenizer)), folder, tokenizer)


def save_with_mtp(config, folder: Path, tokenizer) -> Path:
    save_routed_moe(config, folder, tokenizer)
    torch.manual_seed(1)
    block, h, index = mtp_block(config), config.hidden_size, config.num_hidden_layers
    state = {name: p.detach().normal_(0, 0.2) if "norm" not in name else 1 + 0.1 * torch.randn_like(p)
             for name, p in block.state_dict().items()}
    tensors = {f"model.layers.{index}.{name}": t for name, t in per_expert(state).items()}
    tensors |= {f"model.layers.{index}.{name}": t for name, t in {
        "enorm.weight": 1 + 0.1 * torch.randn(h), "hnorm.weight": 1 + 0.1 * torch.randn(h),
        "eh_proj.weight": 0.2 * torch.randn(h, 2 * h), "shared_head.norm.weight": 1 + 0.1 * torch.randn(h),
        "shared_head.head.weight": 0.2 * torch.randn(config.vocab_size, h)}.items()}
    weights = load_file(str(folder / "model.safetensors"))
    tensors[f"model.layers.{index}.embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights | {name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


def per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' fused experts (gate_up_proj [E, 2I, H], gate first; down_proj [E, H, I]) in the checkpoint's
    per-expert names, as save_pretrained writes them."""
    out = {name: t for name, t in state.items() if ".experts." not in name}
    gate_up, down = state["mlp.experts.gate_up_proj"], state["mlp.experts.down_proj"]
    half = gate_up.shape[1] // 2
    for e in range(gate_up.shape[0]):
        out |= {f"mlp.experts.{e}.gate_proj.weight": gate_up[e, :half], f"mlp.experts.{e}.up_proj.weight": gate_up[e, half:],
                f"mlp.experts.{e}.down_proj.weight": down[e]}
    return out


def fused_experts(weights: dict[str, torch.Tensor], experts: int) -> dict[str, torch.Tensor]:
    """The checkpoint's per-expert tensors as transformers' module holds them."""
    out = {name: t for name, t in weights.items() if ".experts." not in name}
    out["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([weights[f"mlp.experts.{e}.gate_proj.weight"],
                                                              weights[f"mlp.experts.{e}.up_proj.weight"]])
                                                   for e in range(experts)])
    out["mlp.experts.down_proj"] = torch.stack([weights[f"mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
    return out


def reference_first_draft(target, folder: Path, token_ids: list[int]) -> int:
    """The MTP layer's guess for the token after the next, from the target's final hidden states (as vLLM feeds
    it): position p reads (the embedding of token p + 1, zero at position 0; the target's state at p)."""
    config, index = target.config, target.config.num_hidden_layers
    weights = {name.removeprefix(f"model.layers.{index}."): t for name, t in
               load_file(str(folder / "model.safetensors")).items() if name.startswith(f"model.layers.{index}.")}
    block = mtp_block(config)
    fused = fused_experts(weights, config.n_routed_experts)
    block.load_state_dict({k: v for k, v in fused.items() if k in block.state_dict()})
    eps = config.rms_norm_eps

    def rms(x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weights[name]

    with torch.no_grad():
        hidden = target(torch.tensor([token_ids]), output_hidden_states=True).hidden_states[-1][0, :-1]
        embeds = target.get_input_embeddings()(torch.tensor(token_ids[1:]))
        embeds[0] = 0  # position 0
        x = torch.cat([rms(embeds, "enorm.weight"), rms(hidden, "hnorm.weight")], -1) @ weights["eh_proj.weight"].T
        n = x.shape[0]
        positions = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = block(x[None], attention_mask=mask, position_ids=positions,
                    position_embeddings=_family(config)[1](config)(x[None], positions))
        out = out[0] if isinstance(out, tuple) else out
        logits = rms(out[0, -1], "shared_head.norm.weight") @ weights["shared_head.head.weight"].T
    return int(logits.argmax())
