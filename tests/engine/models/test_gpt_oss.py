"""gpt-oss natively: attention sinks, sliding (8 tokens here) and full layers, YaRN, a biased router and experts
with biases and a clamped SwiGLU (the limit lowered so that the clamps bite) — against transformers on the same
random weights: greedy tokens identical and log-probabilities within 1e-3 with chunked prefill; TP 2 with expert
parallelism, and TP 2 slicing every expert, equal to TP 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.families import (
    assert_backend_matches_transformers,
    assert_close,
    assert_tp2_equals_tp1,
    engine_outputs,
    save_routed_moe,
    transformers_reference,
)


def gpt_oss_config(vocab: int):
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=vocab, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
                        num_experts_per_tok=2, sliding_window=8, swiglu_limit=1.5, max_position_embeddings=256,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer) -> Path:
    return save_routed_moe(gpt_oss_config(len(tokenizer)), tmp_path_factory.mktemp("gpt_oss") / "gpt_oss", tokenizer)


def test_gpt_oss_matches_transformers_natively(folder, tokenizer):
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.models.registry import implementation

    spec = load_spec(resolve_model(str(folder), weights=False))
    assert implementation(spec) == ("llmctl", "")  # not the transformers fallback, which refuses the sinks
    assert spec.attention.layer_types == ("sliding", "full", "sliding") and spec.layout.o_bias and spec.attention.sinks
    single, _ = engine_outputs(folder)
    assert_close(transformers_reference(folder, tokenizer), single)


@pytest.mark.parametrize("expert_parallel", [True, False])
def test_tp2_equals_tp1(folder, expert_parallel):
    assert_tp2_equals_tp1(folder, expert_parallel)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_sinks_through_the_triton_and_torch_backends(folder, tokenizer, backend):
    """The Triton kernel (under the interpreter here) and the torch backend's explicit scores: the same tokens."""
    assert_backend_matches_transformers(folder, tokenizer, backend)


def save_mxfp4(folder: Path, into: Path) -> Path:
    """The random model as gpt-oss publishes its checkpoints: the experts' projections as MXFP4 blocks and scales
    (random codes, exponents around 2^-4), everything else as it is, `quant_method: mxfp4` in config.json."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(1)
    tensors = load_file(str(folder / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, inputs, outputs = tensors.pop(name).shape  # stored [E, in, out]; blocks are [E, out, in / 32, 16]
        tensors[f"{name}_blocks"] = torch.randint(0, 256, (experts, outputs, inputs // 32, 16), dtype=torch.uint8,
                                                  generator=generator)
        tensors[f"{name}_scales"] = torch.randint(121, 125, (experts, outputs, inputs // 32), dtype=torch.uint8,
                                                  generator=generator)
    shutil.copytree(folder, into)
    save_file(tensors, str(into / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((into / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (into / "config.json").write_text(json.dumps(config))
    return into


def test_published_mxfp4_experts_are_read(folder, tokenizer, tmp_path, monkeypatch, caplog):
    """Dequantized at load as transformers' own MXFP4 loader does on a CPU (its reference): the same tokens. Then kept
    MXFP4 as on GPUs (the registry's `keeps_mxfp4`, which says yes only for CUDA), the fused-MoE kernel decoding the
    codes in registers (interpreted here): the same tokens again, the experts held at 4.25 bits a weight."""
    import logging

    import torch

    from llmctl import LLM
    from llmctl.engine.layers.mxfp4_experts import Mxfp4Experts

    mxfp4 = save_mxfp4(folder, tmp_path / "gpt_oss_mxfp4")
    prompts = ["The capital of France is", "def fibonacci(n):"]
    reference = transformers_reference(mxfp4, tokenizer, prompts=prompts, max_tokens=12)
    ours, _ = engine_outputs(mxfp4, prompts, tokens=12)
    assert_close(reference, ours, prompts)
    caplog.set_level(logging.INFO, logger="llmctl")
    monkeypatch.setattr("llmctl.engine.models.registry.keeps_mxfp4", lambda device_type: True)
    kept, _ = engine_outputs(mxfp4, prompts, tokens=12)
    assert "MXFP4 experts kept as MXFP4" in caplog.text
    assert_close(reference, kept, prompts)
    llm = LLM(str(mxfp4), max_model_len=64)
    experts = [m for m in llm.engine.executor.loaded.model.modules() if isinstance(m, Mxfp4Experts)]
    assert len(experts) == 3 and all(e.w13.numel() == 0 and e.w13_blocks.dtype == torch.uint8 for e in experts)
    weights = 8 * (64 * 2 * 32 + 32 * 64)  # per layer: 8 experts' gate/up and down
    assert sum(e.w13_blocks.numel() + e.w13_scales.numel() + e.w2_blocks.numel() + e.w2_scales.numel()
               for e in experts) == 3 * weights * 4.25 / 8  # half a byte a weight and a byte per 32
