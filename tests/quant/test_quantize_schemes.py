"""`llmctl quantize --scheme`: compressed-tensors checkpoints that transformers (through compressed-tensors'
own decompression) and llmctl read alike — w4a16 from llmctl's GPTQ, w8a8 from SmoothQuant + GPTQ,
fp8-dynamic from compressed-tensors' round-to-nearest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.compressed import base_model, decoded_agreement, teacher_forced
from helpers.families import assert_close, engine_outputs, transformers_reference
from helpers.quant_helpers import WIKITEXT
from llmctl.errors import LlmctlError


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer) -> Path:
    return base_model(tmp_path_factory.mktemp("schemes") / "base", tokenizer, kv_heads=2)


def quantize(base: Path, out: Path, scheme: str) -> dict:
    from llmctl.quant.command import QuantizeOptions, run_quantize

    summary = run_quantize(QuantizeOptions(model=str(base), method="gptq", scheme=scheme, output=out,
                                           bits=int(scheme[1]) if scheme.startswith("w") else 4,
                                           group_size=-1 if scheme == "w8a8" else 64,
                                           calib_file=WIKITEXT, calib_samples=4, calib_seq_len=64,
                                           redistribute=False, show_progress=False))
    return json.loads((out / "config.json").read_text())["quantization_config"] | {"summary": summary}


def test_w4a16_is_llmctls_gptq_in_compressed_tensors_format(base, tokenizer, tmp_path):
    config = quantize(base, tmp_path / "w4a16", "w4a16")
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    assert config["config_groups"]["group_0"]["weights"] | {"observer": None} == config["config_groups"]["group_0"][
        "weights"] | {"num_bits": 4, "group_size": 64, "strategy": "group", "symmetric": True, "type": "int",
                      "observer": None}
    assert config["ignore"] == ["lm_head"] and config["summary"].layers == 2
    ours, _ = engine_outputs(tmp_path / "w4a16", tokens=32)
    assert_close(transformers_reference(tmp_path / "w4a16", tokenizer, max_tokens=32), ours)


def test_fp8_dynamic_needs_no_calibration_and_agrees_teacher_forced(base, tokenizer, tmp_path):
    config = quantize(base, tmp_path / "fp8", "fp8-dynamic")
    group = config["config_groups"]["group_0"]
    assert group["weights"]["type"] == "float" and group["weights"]["strategy"] == "channel"
    assert group["input_activations"]["dynamic"] is True and group["input_activations"]["strategy"] == "token"
    assert config["summary"].calibration == "none (not needed)"
    assert (tmp_path / "fp8" / "tokenizer.json").exists() and (tmp_path / "fp8" / "README.md").exists()
    agreement, gaps = teacher_forced(tmp_path / "fp8", tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])


def test_w8a8_is_smoothquant_then_gptq_int8_as_llm_compressor_stores_it(base, tokenizer, tmp_path):
    """int-quantized int8 weights per channel, activations per token; transformers (compressed-tensors'
    decompression) and llmctl agree teacher-forced, and llmctl's decode steps run on its integer kernel."""
    from safetensors import safe_open

    config = quantize(base, tmp_path / "w8a8", "w8a8")
    group = config["config_groups"]["group_0"]
    assert config["format"] == "int-quantized" and config["summary"].method == "w8a8"
    assert group["weights"] | {"observer": None} == group["weights"] | {
        "num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "observer": None}
    assert group["input_activations"] | {"observer": None} == group["input_activations"] | {
        "num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True, "observer": None}
    with safe_open(str(tmp_path / "w8a8" / "model.safetensors"), "pt") as stored, \
            safe_open(str(base / "model.safetensors"), "pt") as original:
        assert stored.get_tensor("model.layers.0.self_attn.q_proj.weight").dtype == torch.int8
        norm = "model.layers.0.input_layernorm.weight"  # smoothed: divided by the scales s
        assert not torch.allclose(stored.get_tensor(norm).float(), original.get_tensor(norm).float(), rtol=1e-2)
    agreement, gaps = teacher_forced(tmp_path / "w8a8", tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])
    agreement, gaps = decoded_agreement(tmp_path / "w8a8", tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])


def test_an_unknown_scheme_names_the_ones_there_are(base, tmp_path):
    with pytest.raises(LlmctlError, match="--scheme 'w2a2': choose one of w4a16, w8a16, w8a8, fp8-dynamic"):
        quantize(base, tmp_path / "x", "w2a2")


def test_w8a8_with_other_bits_or_groups_is_one_line(base, tmp_path):
    from llmctl.quant.command import QuantizeOptions, run_quantize

    with pytest.raises(LlmctlError, match="--scheme w8a8 quantizes weights to 8 bits per output channel"):
        run_quantize(QuantizeOptions(model=str(base), method="gptq", scheme="w8a8", output=tmp_path / "x", bits=8,
                                     group_size=128, redistribute=False, show_progress=False))
