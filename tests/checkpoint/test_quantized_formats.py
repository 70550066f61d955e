"""Pre-quantized checkpoints as people download them: compressed-tensors folders written by the
compressed-tensors library (llm-compressor's format), fp8 block-wise files written by transformers'
own FineGrainedFP8 quantizer; each served and compared with transformers loading the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.compressed import (
    base_model,
    compressed_checkpoint,
    decoded_agreement,
    fp8_block_checkpoint,
    teacher_forced,
)
from helpers.families import assert_close, engine_outputs, transformers_reference
from helpers.models import save_random_model
from llmctl import LLM
from llmctl.errors import CorruptModelError, UnsupportedModelError

TOKENS = 32


@pytest.fixture(scope="module")
def base(tmp_path_factory, tokenizer) -> Path:
    return base_model(tmp_path_factory.mktemp("quantized") / "base", tokenizer, kv_heads=4)


@pytest.mark.parametrize("preset", ["W4A16", "W8A16"])
def test_weight_only_compressed_tensors_generate_what_transformers_generates(base, tokenizer, tmp_path, preset):
    folder = compressed_checkpoint(base, preset, tmp_path / preset, tokenizer)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(transformers_reference(folder, tokenizer, max_tokens=TOKENS), ours)


@pytest.mark.parametrize("preset, form", [("MXFP4A16", "mxfp4-pack-quantized"), ("NVFP4A16", "nvfp4-pack-quantized")])
def test_fp4_weights_dequantized_at_load_generate_what_transformers_generates(base, tokenizer, tmp_path, preset, form):
    """MXFP4 (E8M0 scales per 32) and NVFP4 (FP8 scales per 16 under a global scale) weights, written by the
    compressed-tensors library, dequantized at load by it; transformers decompresses the same folder itself."""
    from transformers import CompressedTensorsConfig

    folder = compressed_checkpoint(base, preset, tmp_path / preset, tokenizer)
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["format"] == form
    ours, _ = engine_outputs(folder, tokens=TOKENS)
    decompressed = CompressedTensorsConfig(run_compressed=False)  # dense float32 weights, not its fake-quant forward
    assert_close(transformers_reference(folder, tokenizer, max_tokens=TOKENS, quantization_config=decompressed), ours)


def test_w4a16_stays_4_bit_and_w8a8_8_bit_on_the_cpu_kernels(base, tokenizer, tmp_path):
    from llmctl.engine.layers.coded_linear import CodedLinear
    from llmctl.engine.layers.quant_linear import QuantLinear

    folder = compressed_checkpoint(base, "W4A16", tmp_path / "w4a16", tokenizer)
    layers = [m for m in LLM(str(folder), max_model_len=128).engine.executor.loaded.model.modules()
              if isinstance(m, QuantLinear)]
    assert len(layers) == 8 and all(layer.cpu_int4 is not None for layer in layers)  # q/k/v, o, gate/up, down × 2
    folder = compressed_checkpoint(base, "W8A8", tmp_path / "w8a8", tokenizer)
    layers = [m for m in LLM(str(folder), max_model_len=128).engine.executor.loaded.model.modules()
              if isinstance(m, CodedLinear)]
    assert len(layers) == 8 and all(layer.coded is not None and layer.coded.bits == 8 and layer.coded.per_token_kernel
                                    and layer.activation_args is not None for layer in layers)


def test_w8a8_decode_steps_in_integers_agree_with_transformers(base, tokenizer, tmp_path):
    """Decode steps multiply int8 activations (quantized per token in q8_linear) by the int8 weights; each token
    llmctl generates is checked against transformers on the same prefix, as the teacher-forced test below."""
    folder = compressed_checkpoint(base, "W8A8", tmp_path / "w8a8", tokenizer)
    agreement, gaps = decoded_agreement(folder, tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])


@pytest.mark.parametrize("preset", ["W8A8", "FP8_DYNAMIC"])
def test_activation_schemes_agree_with_transformers_teacher_forced(base, tokenizer, tmp_path, preset):
    """int8 / fp8 activations quantized per token as the scheme says (compressed-tensors' own functions). Not
    token for token: where the engine's float rounding differs from transformers' by one unit, an activation can
    round to the neighbouring int8/fp8 value (a step of up to 1/8 in fp8): 99 % of the 256 positions stay within
    0.05, every one within 0.1."""
    folder = compressed_checkpoint(base, preset, tmp_path / preset, tokenizer)
    agreement, gaps = teacher_forced(folder, tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])


def test_blockwise_fp8_generates_what_transformers_generates(base, tokenizer, tmp_path, caplog):
    import logging

    folder = fp8_block_checkpoint(base, tmp_path / "fp8")
    with caplog.at_level(logging.INFO, logger="llmctl.engine"):
        ours, _ = engine_outputs(folder, tokens=TOKENS)
    assert_close(transformers_reference(folder, tokenizer, max_tokens=TOKENS), ours)
    assert any("fp8 weights dequantized once at load into float32" in r.getMessage() for r in caplog.records)


def test_a_missing_scale_and_an_unknown_method_are_one_line_each(base, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = fp8_block_checkpoint(base, tmp_path / "broken")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight_scale_inv"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CorruptModelError, match=r"model\.layers\.1\.mlp\.down_proj\.weight is stored in float8 with "
                                                r"no scale \(weight_scale or weight_scale_inv\)"):
        LLM(str(folder), max_model_len=128)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="quant_method 'bitsandbytes' is not supported .llmctl serves "
                                                    "GPTQ, AWQ, GGUF, FP8 and compressed-tensors"):
        LLM(str(folder), max_model_len=128)


def test_inspect_and_plan_name_the_scheme_and_where_llmctl_keeps_it(base, tokenizer, tmp_path):
    from helpers.cli_process import run_cli

    w4a16 = compressed_checkpoint(base, "W4A16", tmp_path / "w4a16", tokenizer)
    shown = run_cli("inspect", str(w4a16))
    assert shown.returncode == 0, shown.stderr
    assert "compressed-tensors pack-quantized (W: int4 group 128; A: not quantized)" in shown.stdout
    assert "differs" not in shown.stdout  # the packed int32 words count as 8 weights each
    planned = run_cli("plan", str(w4a16), "--gpus", "1")
    assert planned.returncode == 0, planned.stderr
    assert "weights gptq" in planned.stdout and "llmctl quantize" not in planned.stdout
    assert "keeps these 4-bit weights quantized" in " ".join(planned.stdout.split())
    fp8 = fp8_block_checkpoint(base, tmp_path / "fp8")
    planned = " ".join(run_cli("plan", str(fp8), "--gpus", "1").stdout.split())
    assert "weights fp8" in planned and "keeps these fp8 weights as float8, a byte each" in planned
    config = json.loads((w4a16 / "config.json").read_text())
    config["quantization_config"]["format"] = "sparse-24-bitmask"
    (w4a16 / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="compressed-tensors format 'sparse-24-bitmask' is not read yet"):
        LLM(str(w4a16), max_model_len=128)


def moe_family_config(family: str, vocab: int):
    from transformers import DeepseekV2Config

    from helpers.families import moe_config

    if family == "qwen3-moe":
        return moe_config(family, vocab)
    # MLA attention, a dense first layer, then 8 routed experts (top 2) beside a shared one
    return DeepseekV2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32,
                            q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                            max_position_embeddings=256)


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v2"])
def test_blockwise_fp8_experts_and_mla_generate_what_transformers_generates(tokenizer, tmp_path, family):
    """Every expert's projections in fp8 with their own block scales (16 × 16 on these 64-wide models)."""
    torch.manual_seed(0)
    base = save_random_model(moe_family_config(family, len(tokenizer)), tmp_path / "base", tokenizer)
    folder = fp8_block_checkpoint(base, tmp_path / "fp8", block=16)
    ours, _ = engine_outputs(folder, tokens=16)
    assert_close(transformers_reference(folder, tokenizer, max_tokens=16), ours)


def packed_checkpoint(family: str, method: str, tokenizer, tmp_path: Path) -> tuple[Path, Path]:
    """A random `family` model with every projection packed in `method` (round to nearest, groups of 32), and the
    same weights unpacked by the formats module, saved as a dense checkpoint transformers loads itself."""
    from safetensors.torch import load_file, save_file

    from helpers.quant_helpers import dequantized_state
    from llmctl.checkpoint.quant_formats import pack_awq, pack_gptq, unpack_awq, unpack_gptq
    from llmctl.quant.rtn import QuantConfig, rtn_quantize
    from llmctl.quant.writer import quantization_config

    torch.manual_seed(0)
    base = save_random_model(moe_family_config(family, len(tokenizer)), tmp_path / "base", tokenizer)
    config = QuantConfig(4, 32, symmetric=method == "gptq")
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(base / "model.safetensors").items():
        if name.endswith(("proj.weight", "proj_with_mqa.weight")):
            packed = (pack_gptq if method == "gptq" else pack_awq)(rtn_quantize(tensor, config))
            tensors.update({f"{name.removesuffix('weight')}{kind}": value for kind, value in packed.items()})
        else:
            tensors[name] = tensor
    folder, dense = tmp_path / method, tmp_path / f"{method}-dense"
    for out in (folder, dense):
        out.mkdir()
        tokenizer.save_pretrained(str(out))
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    model_config = json.loads((base / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps(model_config))
    model_config["quantization_config"] = quantization_config(method, config)
    (folder / "config.json").write_text(json.dumps(model_config))
    unpack = (lambda parts: unpack_gptq(parts, 4, 32)) if method == "gptq" else (lambda parts: unpack_awq(parts, 32))
    save_file(dequantized_state(folder, unpack), dense / "model.safetensors", metadata={"format": "pt"})
    return folder, dense


@pytest.mark.parametrize("family, method", [("qwen3-moe", "gptq"), ("qwen3-moe", "awq"), ("deepseek-v2", "gptq")])
def test_gptq_and_awq_experts_load_and_match_their_dequantized_weights(tokenizer, tmp_path, family, method):
    """A Qwen3-MoE or a DeepSeek-V2 (MLA) with attention and every expert packed: Qwen's attention stays packed,
    DeepSeek's is dequantized at load (MLA's layers take no packed weights); the routed experts are kept as 4-bit
    codes on a CPU; transformers runs the same weights unpacked by the formats module."""
    from llmctl.engine.layers.coded_linear import CodedWeight
    from llmctl.engine.layers.moe import FusedMoE

    folder, dense = packed_checkpoint(family, method, tokenizer, tmp_path)
    reference = transformers_reference(dense, tokenizer, max_tokens=16)
    ours, _ = engine_outputs(folder, tokens=16)
    assert_close(reference, ours)
    if method == "gptq":  # expert parallel over two ranks: experts (DeepSeek: everything) dequantized, the same
        spread, _ = engine_outputs(folder, tokens=16, tensor_parallel_size=2, enable_expert_parallel=True)
        assert_close(reference, spread)
    layers = [m for m in LLM(str(folder), max_model_len=128).engine.executor.loaded.model.modules()
              if isinstance(m, FusedMoE)]  # on a CPU the routed experts stay 4-bit, on the int4 kernel
    assert layers and all(m.coded is not None and m.w13.numel() == 0 for m in layers)
    assert all(isinstance(w, CodedWeight) and w.bits == 4 for m in layers for w in m.coded.w13 + m.coded.w2)
    if family == "deepseek-v2":  # plan says what serve does with it on GPUs
        from helpers.cli_process import run_cli

        planned = " ".join(run_cli("plan", str(folder), "--gpus", "1").stdout.split())
        assert "dequantizes these GPTQ weights once at load into bfloat16 (its MLA layers take no packed" in planned
