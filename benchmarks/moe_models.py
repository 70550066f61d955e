"""Random-weight models for measuring mixture-of-experts decoding: does time per token follow the
active parameters or the total?

    python benchmarks/moe_models.py DIR      # writes DIR/{moe-8x,moe-32x,dense-active,dense-total,
                                             #                 deepseek-16x,deepseek-64x}
    llmctl bench offline DIR/moe-8x --num-prompts 16 --random-input-len 64 --random-output-len 64 \
        --temperature 0 --compare transformers

All four share Mixtral's attention shape (hidden 512, 8 heads, 4 layers). moe-8x and moe-32x route
each token to 2 experts of intermediate 1024 (active MLP: 2 × 1024), out of 8 and 32; dense-active
has one MLP of intermediate 2048 (the same active parameters), dense-total one of 8192 (moe-8x's
total). deepseek-16x and deepseek-64x are DeepSeek-V2-Lite-shaped (multi-head latent attention with
kv_lora_rank 128, q straight from q_proj, layer 0 dense, then 2 routed experts of intermediate 512 and one
shared expert per token) out of 16 and 64. The tokenizer is the default model's.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(folder: Path) -> None:
    from transformers import (
        AutoTokenizer,
        DeepseekV2ForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MixtralConfig,
        MixtralForCausalLM,
    )

    from llmctl.checkpoint.source import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    shape = dict(vocab_size=len(tokenizer), hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=8, max_position_embeddings=1024)
    models = {
        "moe-8x": MixtralForCausalLM(MixtralConfig(intermediate_size=1024, num_local_experts=8, **shape)),
        "moe-32x": MixtralForCausalLM(MixtralConfig(intermediate_size=1024, num_local_experts=32, **shape)),
        "dense-active": LlamaForCausalLM(LlamaConfig(intermediate_size=2048, **shape)),
        "dense-total": LlamaForCausalLM(LlamaConfig(intermediate_size=8192, **shape)),
        "deepseek-16x": DeepseekV2ForCausalLM(deepseek(16, shape)),
        "deepseek-64x": DeepseekV2ForCausalLM(deepseek(64, shape)),
    }
    for name, model in models.items():
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        print(f"{folder / name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")


def deepseek(experts: int, shape: dict):
    from transformers import DeepseekV2Config

    return DeepseekV2Config(intermediate_size=2048, moe_intermediate_size=512, n_routed_experts=experts,
                            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=128,
                            q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
                            topk_method="greedy", **shape)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
