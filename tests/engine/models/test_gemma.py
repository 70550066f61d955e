"""Gemma 2 and Gemma 3 (issue 34) against transformers' eager implementation: random weights, windows
short enough that the prompts and generations slide past them, soft-caps low enough to bite; 8 prompts ×
64 greedy tokens identical, prompt and sampled log-probabilities within 1e-3, on every attention backend
and through the transformers path; TP 2 and PP 2 equal to one process; served; LoRA; quantized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.families import (
    PROMPTS,
    WINDOW,
    assert_close,
    assert_peft_adapter_matches,
    assert_ranks_hold_what_plan_says,
    assert_served_like_transformers,
    engine_outputs,
    gemma3_text_config,
    transformers_reference,
)
from helpers.models import save_random_model

pytestmark = pytest.mark.subprocess


def gemma2_config(vocab: int):
    from transformers import Gemma2Config

    # head_dim 16 with query_pre_attn_scalar 24: the softmax scale is not 1/√head_dim; caps of 5 and 3 are
    # reached by these random weights (the real ones are 50 and 30)
    return Gemma2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                        sliding_window=WINDOW, attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                        max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)


FAMILIES = {"gemma2": gemma2_config, "gemma3": gemma3_text_config}


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gemma")
    return {name: save_random_model(make(len(tokenizer)), tmp / name, tokenizer) for name, make in FAMILIES.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_tokens_and_logprobs_equal_transformers(models, tokenizer, family, backend):
    ours, _ = engine_outputs(models[family], attention_backend=backend)
    assert_close(transformers_reference(models[family], tokenizer), ours)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_transformers_path_pages_mixed_windows_and_soft_caps(models, tokenizer, family):
    """--model-impl transformers: transformers' Gemma modules over llmctl's hybrid KV cache."""
    ours, _ = engine_outputs(models[family], model_impl="transformers")
    assert_close(transformers_reference(models[family], tokenizer), ours)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_triton_backend_applies_each_layers_window_and_the_softcap(models, tokenizer, family):
    prompts = PROMPTS[4:6]  # the two longest: each slides past the window (the interpreter is slow)
    ours, _ = engine_outputs(models[family], prompts, 16, attention_backend="triton")
    assert_close(transformers_reference(models[family], tokenizer, prompts=prompts, max_tokens=16), ours, prompts)


@pytest.mark.parametrize("family,parallel", [("gemma2", {"tensor_parallel_size": 2}),
                                             ("gemma3", {"tensor_parallel_size": 2}),
                                             ("gemma3", {"pipeline_parallel_size": 2})])
def test_tp2_and_pp2_equal_one_process(models, family, parallel):
    """PP 2 over Gemma 3's layers: the sliding layers on one stage, the full one on the other, one table each."""
    single, _ = engine_outputs(models[family])
    sharded, memory = engine_outputs(models[family], **parallel)
    assert len(memory) == 2
    for (tokens, sampled, _), (their_tokens, their_sampled, _) in zip(single, sharded):
        assert their_tokens == tokens and max(abs(a - b) for a, b in zip(sampled, their_sampled)) <= 1e-4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_rank_holds_what_plan_says(models, family):
    assert_ranks_hold_what_plan_says(models[family])  # KV: one block is a page in each of the group's slots


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory, tokenizer) -> Path:
    """A Gemma3ForConditionalGeneration checkpoint (saved by transformers under the published names,
    language_model.model.*, beside vision_tower.* and multi_modal_projector.*)."""
    from transformers import Gemma3Config, SiglipVisionConfig

    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    config = Gemma3Config(text_config=gemma3_text_config(len(tokenizer)).to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=4)
    return save_random_model(config, tmp_path_factory.mktemp("gemma3-multimodal") / "model", tokenizer)


def test_the_text_tower_of_gemma3_for_conditional_generation(multimodal, tokenizer):
    """The multimodal checkpoint served text-only: its language model's tensors load, the vision tower's stay
    on disk, and the tokens are those of transformers' own Gemma3ForConditionalGeneration on text."""
    from transformers import Gemma3ForConditionalGeneration

    ours, _ = engine_outputs(multimodal)
    assert_close(transformers_reference(multimodal, tokenizer, Gemma3ForConditionalGeneration), ours)
    assert_served_like_transformers(multimodal, tokenizer, Gemma3ForConditionalGeneration)


def test_llmctl_quantize_takes_the_language_model_of_a_multimodal_gemma3(multimodal, tmp_path):
    """GPTQ on the language model; the vision tower and projector are written as they were (16-bit) and
    named in `dynamic`, GPTQModel's field that vLLM reads to build them unquantized. Served like
    transformers' Gemma3ForConditionalGeneration loading the unpacked weights (its own name mapping)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import Gemma3ForConditionalGeneration

    from helpers.families import quantize
    from helpers.quant_helpers import assert_engine_matches_dense
    from llmctl.checkpoint.quant_formats import unpack_gptq

    out = quantize(multimodal, "gptq", tmp_path / "gemma3-mm-gptq")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["dynamic"] == {"-:.*(vision_tower|multi_modal_projector).*": {}}
    with safe_open(str(out / "model.safetensors"), framework="pt") as quantized, \
            safe_open(str(multimodal / "model.safetensors"), framework="pt") as original:
        assert "language_model.model.layers.0.self_attn.q_proj.qweight" in quantized.keys()
        towers = [n for n in original.keys() if n.startswith(("vision_tower.", "multi_modal_projector."))]
        assert towers and not any(n.startswith(("vision_tower.", "multi_modal_projector.")) and "qweight" in n
                                  for n in quantized.keys())
        for name in towers:
            torch.testing.assert_close(quantized.get_tensor(name), original.get_tensor(name).half())

    def dense_model(folder: Path, state: dict) -> torch.nn.Module:
        save_file({name: t.contiguous() for name, t in state.items()}, str(folder / "model.safetensors"))
        return Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32,
                                                              attn_implementation="eager").eval()

    assert_engine_matches_dense(out, lambda parts: unpack_gptq(parts, 4, 32), PROMPTS[4], dense_model)


def test_quantize_eval_scores_a_multimodal_checkpoint_by_its_language_model(multimodal):
    """`--eval`'s reference model for a multimodal checkpoint: the language model alone, from the checkpoint's
    tensors, computes the logits of transformers' whole Gemma3ForConditionalGeneration on text."""
    from safetensors.torch import load_file
    from transformers import Gemma3ForConditionalGeneration

    from llmctl.quant.evaluate import load_dense_model

    ids = torch.arange(3, 40)[None]
    text_only = load_dense_model(multimodal, {n: t.float() for n, t in load_file(str(multimodal / "model.safetensors"))
                                              .items()})
    whole = Gemma3ForConditionalGeneration.from_pretrained(str(multimodal), dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(text_only(ids).logits, whole(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_peft_adapter_matches_transformers_with_peft(models, tokenizer, family, tmp_path):
    assert_peft_adapter_matches(models[family], tokenizer, tmp_path)


@pytest.mark.parametrize("family,method", [("gemma2", "gptq"), ("gemma3", "awq")])
def test_llmctl_quantize_writes_a_checkpoint_the_engine_serves(models, family, method, tmp_path):
    """AWQ folds its scales into Gemma's (1 + weight) norms; the calibration forward masks each sliding
    layer's window and soft-caps as the model does."""
    from helpers.cli_process import run_cli
    from helpers.quant_helpers import WIKITEXT, assert_engine_matches_dense
    from llmctl.checkpoint.quant_formats import unpack_awq, unpack_gptq

    out = tmp_path / f"{family}-{method}"
    result = run_cli("quantize", str(models[family]), f"--{method}", "--group-size", "32", "--calib-file",
                     str(WIKITEXT), "--calib-samples", "4", "--calib-seq-len", "64", "--output", str(out),
                     "--no-redistribute")
    assert result.returncode == 0, result.stdout + result.stderr
    unpack = (lambda parts: unpack_gptq(parts, 4, 32)) if method == "gptq" else (lambda parts: unpack_awq(parts, 32))
    assert_engine_matches_dense(out, unpack, PROMPTS[4])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_served_with_the_openai_client(models, tokenizer, family):
    assert_served_like_transformers(models[family], tokenizer)


def test_awq_scales_folded_into_a_gemma_norm_leave_the_block_unchanged():
    """transformers' Gemma RMSNorm scales by (1 + weight): dividing its output by s must keep that form."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from llmctl.quant.awq import ScaleGroup, apply_scales

    torch.manual_seed(0)
    norm, linear = Gemma2RMSNorm(64), torch.nn.Linear(64, 32, bias=False)
    with torch.no_grad():
        norm.weight.normal_(0, 0.5)
    x, scales = torch.randn(5, 64), torch.rand(64) + 0.5
    before = linear(norm(x))
    with torch.no_grad():
        apply_scales(ScaleGroup(norm, [linear], x, linear, unit_offset=True), scales)
    torch.testing.assert_close(linear(norm(x)), before, atol=1e-5, rtol=1e-5)
