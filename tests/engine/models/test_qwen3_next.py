"""Qwen3-Next natively — gated DeltaNet on two layers in four, gated attention (q_proj's per-head gate, (1 + w)
QK-norms, a quarter of each head rotated), Qwen2-MoE experts with a gated shared expert — against transformers on
the same random weights: greedy tokens identical and log-probabilities within 1e-3, with prompts chunked at 16
tokens (each sequence's delta-rule state carried between steps) and, in one step, a prompt over two of the delta
rule's 64-token chunks; the attention through the Triton interpreter too; TP 2 as TP 1. Qwen3.5 (its DeltaNet's
projections apart), dense, and MoE as published (multimodal, experts as whole-layer tensors), text-only."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    PROMPTS,
    assert_backend_matches_transformers,
    assert_close,
    assert_decodes_through_the_gpu_kernel,
    assert_tp2_equals_tp1,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)

TOKENS = 40
LONG = ["The history of the city goes back to a small fishing village on the river, where traders from the north "
        "and the south met every spring to exchange furs, salt, grain and stories. Over the centuries the village "
        "grew into a market town, then a walled city with a cathedral, a university and a harbour that sheltered "
        "ships from every corner of the known world, and its people came to be known for their"]


def qwen3_next_config(vocab: int):
    from transformers import Qwen3NextConfig

    # two key heads shared by four value heads in the DeltaNet; GQA in the attention
    return Qwen3NextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                           linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                           shared_expert_intermediate_size=48, decoder_sparse_step=1, max_position_embeddings=512,
                           layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(qwen3_next_config(len(tokenizer)), tmp_path_factory.mktemp("qwen3_next") / "m", tokenizer)


def test_qwen3_next_matches_transformers(folder, tokenizer):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation

    spec = load_spec(resolve_model(str(folder), weights=False))
    assert implementation(spec) == ("llmctl", "") and spec.mixer is not None and spec.attention.output_gate
    reference = transformers_reference(folder, tokenizer, max_tokens=TOKENS)
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(reference, ours)


def test_a_prompt_over_several_delta_rule_chunks_in_one_step(folder, tokenizer):
    assert len(tokenizer(LONG[0]).input_ids) > 64
    reference = transformers_reference(folder, tokenizer, prompts=LONG, max_tokens=16)
    ours, _ = engine_outputs(folder, LONG, tokens=16, max_num_batched_tokens=256)
    assert_close(reference, ours, LONG)


def test_prompts_scanned_together(folder, tokenizer):
    """All prompts in one step: those of similar lengths through one delta rule, padded with g = β = 0."""
    reference = transformers_reference(folder, tokenizer, max_tokens=16)
    ours, _ = engine_outputs(folder, tokens=16, max_num_batched_tokens=512)
    assert_close(reference, ours)


def test_qwen3_next_attention_through_triton(folder, tokenizer):
    assert_backend_matches_transformers(folder, tokenizer, "triton")


def test_qwen3_next_decodes_through_the_gpu_kernel(folder, tokenizer, monkeypatch):
    """The delta rule's decode path on GPUs (kernels/recurrent_decode.py) under Triton's interpreter."""
    assert_decodes_through_the_gpu_kernel(folder, tokenizer, monkeypatch)


def test_tp2_equals_tp1(folder):
    """Key heads with their value heads, the attention's heads and every expert split over two ranks; each rank
    holds the weights and states plan says."""
    assert_tp2_equals_tp1(folder, expert_parallel=False)


QWEN3_5_TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                    linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    max_position_embeddings=512,
                    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])


def test_qwen3_5_dense_matches_transformers(tmp_path, tokenizer):
    """Qwen3.5's DeltaNet projects q·k·v, z, b and a apart; a dense MLP on every layer. Its parameters as
    transformers counts them (here, not in tests/checkpoint/test_params.py: transformers' floor has no Qwen3.5)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.params import count_from_config
    from llmctl.checkpoint.source import resolve_model

    folder = save_routed_moe(Qwen3_5TextConfig(vocab_size=len(tokenizer), **QWEN3_5_TEXT), tmp_path / "q35", tokenizer)
    spec = load_spec(resolve_model(str(folder), weights=False))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)  # (its floor's transformers lacks it)
    assert count_from_config(spec).total == sum(p.numel() for p in hf.parameters())
    prompts = PROMPTS[:4]
    reference = transformers_reference(folder, tokenizer, prompts=prompts, max_tokens=24)
    ours, _ = engine_outputs(folder, prompts, tokens=24)
    assert_close(reference, ours, prompts)


def save_fused_experts(folder: Path, into: Path) -> Path:
    """The model as Qwen3.5-MoE is published: each layer's experts as experts.gate_up_proj [E, 2I, H] (gate rows,
    then up rows) and experts.down_proj [E, H, I]."""
    import re
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if ".mlp.experts." in n]:
        prefix, index, projection = re.match(r"(.*\.experts)\.(\d+)\.(\w+)\.weight", name).groups()
        experts.setdefault(prefix, {}).setdefault(int(index), {})[projection] = tensors.pop(name)
    for prefix, by_index in experts.items():
        ordered = [by_index[i] for i in sorted(by_index)]
        tensors[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in ordered])
        tensors[f"{prefix}.down_proj"] = torch.stack([e["down_proj"] for e in ordered])
    shutil.copytree(folder, into)
    save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    return into


def test_qwen3_5_moe_as_published_served_text_only(tmp_path, tokenizer):
    """The multimodal Qwen3.5-MoE checkpoint (language model under model.language_model, a vision tower, experts as
    whole-layer tensors) runs its language model natively: the tokens of transformers' own model of that folder."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text = dict(QWEN3_5_TEXT, vocab_size=len(tokenizer), num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=48)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision)
    folder = save_routed_moe(config, tmp_path / "q35moe", tokenizer, Qwen3_5MoeForConditionalGeneration)
    published = save_fused_experts(folder, tmp_path / "fused")
    prompts = PROMPTS[:4]
    reference = transformers_reference(folder, tokenizer, Qwen3_5MoeForConditionalGeneration, prompts, 24)
    ours, _ = engine_outputs(published, prompts, tokens=24)
    assert_close(reference, ours, prompts)
