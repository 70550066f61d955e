"""`llmctl quantize --format gguf`: K-quant blocks and whole files against what llama.cpp's own quantizer wrote
(tests/fixtures/llama_cpp, with their source), and the file as a user gets it from the CLI, read by gguf-py and
served by llmctl against transformers' own GGUF loading of the same file."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers.gguf_export_model import k_quant_inputs, write_export_model
from llmctl.errors import LlmctlError
from llmctl.quant.gguf_export import export_gguf
from llmctl.quant.gguf_mix import more_bits, tensor_type
from llmctl.quant.k_quants import quantize_q4_k, quantize_q5_k, quantize_q6_k

LLAMA_CPP = Path(__file__).parent.parent / "fixtures" / "llama_cpp"


@pytest.mark.parametrize("type_name, quantize", [("Q4_K", quantize_q4_k), ("Q5_K", quantize_q5_k),
                                                 ("Q6_K", quantize_q6_k)])
def test_k_quant_blocks_are_llama_cpps_byte_for_byte(type_name, quantize):
    expected = json.loads((LLAMA_CPP / "k_quant_blocks.json").read_text())[type_name]
    for kind, values in k_quant_inputs().items():
        assert quantize(values).tobytes().hex() == expected[kind], kind


def test_k_quant_blocks_decode_close_to_the_weights_with_gguf_py():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    values = k_quant_inputs()["normal"]
    for quantize, kind, bound in ((quantize_q4_k, "Q4_K", 0.1), (quantize_q5_k, "Q5_K", 0.05),
                                  (quantize_q6_k, "Q6_K", 0.025)):
        decoded = dequantize(quantize(values), GGMLQuantizationType[kind])
        assert np.sqrt(np.mean((decoded - values) ** 2)) < bound  # 4.5, 5.5 and 6.6 bits per weight on N(0, 1)


@pytest.fixture(scope="module")
def export_model(tmp_path_factory, tokenizer) -> Path:
    return write_export_model(tmp_path_factory.mktemp("gguf-export") / "model", tokenizer)


FILES = [("llama", "Q4_K_M"), ("llama", "Q8_0"), ("mixtral", "Q4_K_M"), ("qwen2_moe", "Q4_K_M")]


@pytest.mark.parametrize("family, mix", FILES)
def test_every_tensor_is_what_llama_quantize_wrote(family, mix, tokenizer, tmp_path):
    """Same types (Q6_K where llama.cpp spends more bits, fallbacks for 288-wide rows, Q8_0/Q5_K for an 8-expert
    model's attention, experts stacked per layer) and the same bytes; a mixture of experts reads back in llmctl
    with its config's experts, their sizes and the shared expert's."""
    from gguf import GGUFReader

    from llmctl.checkpoint.gguf_convert import convert_gguf

    folder = write_export_model(tmp_path / family, tokenizer, family)
    out = tmp_path / f"{family}-{mix}.gguf"
    written = export_gguf(folder, out, mix, "export-model")
    ours = {t.name: [t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()]
            for t in GGUFReader(str(out)).tensors}
    expected = json.loads((LLAMA_CPP / "gguf_tensors.json").read_text())[family][mix]
    assert ours == expected
    assert written.types == {name: kind for name, (kind, _) in expected.items()}
    if family != "llama":
        (tmp_path / "converted").mkdir()
        convert_gguf(out, tmp_path / "converted", show_progress=False)
        original, converted = (json.loads((path / "config.json").read_text()) for path in (folder, tmp_path / "converted"))
        keys = ["num_experts_per_tok", "intermediate_size", "hidden_size", "num_hidden_layers", "num_key_value_heads"]
        keys += ["num_local_experts"] if family == "mixtral" else ["num_experts", "moe_intermediate_size",
                                                                    "shared_expert_intermediate_size", "norm_topk_prob"]
        assert {key: converted[key] for key in keys} == {key: original[key] for key in keys}


def test_more_bits_layers_are_llama_cpps():
    # llama-quant.cpp: the first and last eighth, and every third layer between
    assert [layer for layer in range(32) if more_bits(layer, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27,
                                                                     28, 29, 30, 31]
    assert tensor_type("blk.0.attn_norm.weight", 1, 256, "Q4_K_M", 8, True) == "F32"
    assert tensor_type("blk.0.attn_q.weight", 2, 576, "Q4_K_M", 8, True) == "Q5_0"  # 576 is no multiple of 256
    assert tensor_type("blk.0.attn_q.weight", 2, 100, "Q8_0", 8, True) == "F16"


def test_refusals_name_what_is_supported(export_model, tmp_path):
    config = json.loads((export_model / "config.json").read_text())
    for change, words in ((dict(architectures=["BloomForCausalLM"]), "writes LlamaForCausalLM"),
                          (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "'llama3' RoPE scaling"),
                          (dict(quantization_config={"quant_method": "gptq"}), "already quantized (gptq)")):
        folder = tmp_path / "changed"
        folder.mkdir(exist_ok=True)
        for item in export_model.iterdir():
            if not (folder / item.name).exists():
                (folder / item.name).symlink_to(item)
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(LlmctlError, match=words.replace("(", r"\(").replace(")", r"\)")):
            export_gguf(folder, tmp_path / "out.gguf", "Q4_K_M", "x")


@pytest.mark.subprocess
def test_cli_gguf_loads_in_gguf_py_and_llmctl_serves_it_as_transformers_reads_it(export_model, tmp_path):
    """`llmctl quantize MODEL --format gguf` as typed: the file gguf-py reads, with Q4_K_M's types; llmctl on it,
    dequantized, gives transformers' greedy tokens on the same file exactly, and coded (int8 activations, as
    llama.cpp) agrees by vLLM's rule for quantized models."""
    from gguf import GGUFReader

    from helpers.cli_process import run_cli
    from helpers.gguf_models import assert_served_as_transformers_reads_it

    out = tmp_path / "model-Q4_K_M.gguf"
    result = run_cli("quantize", str(export_model), "--format", "gguf", "--output", str(out), "--no-redistribute",
                     "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    reader = GGUFReader(str(out))
    expected = json.loads((LLAMA_CPP / "gguf_tensors.json").read_text())["llama"]["Q4_K_M"]
    assert {t.name: t.tensor_type.name for t in reader.tensors} == {name: kind for name, (kind, _) in expected.items()}
    assert summary["gguf_types"] == dict(Counter(kind for kind, _ in expected.values()))
    assert reader.fields["general.file_type"].contents() == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert reader.fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert_served_as_transformers_reads_it(out, "Q4_K_M")


def test_cli_refuses_a_gguf_scheme_without_gguf_and_a_compressed_scheme_with_it(tmp_path):
    from helpers.cli_process import run_cli

    wrong = run_cli("quantize", "--format", "gguf", "--scheme", "w8a8", "--output", str(tmp_path / "x.gguf"))
    assert wrong.returncode != 0 and "--format gguf writes --scheme Q4_K_M or Q8_0" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    missing = run_cli("quantize", "--scheme", "q4_k_m", "--output", str(tmp_path / "y"))
    assert missing.returncode != 0 and "is a GGUF type: add --format gguf" in missing.stderr
    folder = run_cli("quantize", "--format", "gguf", "--output", str(tmp_path))
    assert folder.returncode != 0 and "is a folder: --format gguf writes one file" in folder.stderr
