"""compressed-tensors checkpoints written by llm-compressor itself (its `oneshot` with its W4A16, W8A8 and
FP8_DYNAMIC recipes: GPTQ, SmoothQuant + GPTQ, no calibration), served by llmctl against transformers
decompressing the same folder with compressed-tensors:

- weight-only W4A16 on tiny Llama, Qwen3-MoE and DeepSeek-V2 (MLA): every greedy token llmctl generates is
  transformers' most likely next token on the same prefix (exactly, or within float noise where two tie) with
  the same log-probability, 8 prompts × 32 tokens; the weights stay 4-bit on the int4 kernel (a mixture's routed
  experts as its codes);
- W8A8 and FP8_DYNAMIC (activations quantized per token) on Llama: ≥ 95 % teacher-forced top-1 agreement,
  99 % of log-probabilities within 0.05; W8A8's weights stay int8 codes with the per-token kernel.

llm-compressor runs in a subprocess (tests/helpers/llmcompressor_reference.py) in its own venv
(.venv-llmcompressor, made by scripts/setup.sh: it pins transformers ≤ 5.17)."""

from __future__ import annotations

import json
import os
import subprocess
from functools import cache
from pathlib import Path

import pytest
import torch

from helpers.compressed import teacher_forced
from helpers.families import PROMPTS
from helpers.paths import FIXTURES, ROOT, TESTS

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

PYTHON = ROOT / ".venv-llmcompressor" / "bin" / "python"
REFERENCE = TESTS / "helpers" / "llmcompressor_reference.py"
WIKITEXT = FIXTURES / "data" / "wikitext-2-raw-test.hfdatasets-derived.crlf.txt"
TOKENS = 32


def base_config(family: str, tokenizer):
    from transformers import DeepseekV2Config, LlamaConfig, Qwen3MoeConfig

    common = dict(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2,
                              head_dim=32, **common)
    if family == "deepseek_v2":  # MLA (no query compression, as V2-Lite), one dense layer, then experts
        return DeepseekV2Config(intermediate_size=256, moe_intermediate_size=128, n_routed_experts=4,
                                num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                kv_lora_rank=128, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=32,
                                v_head_dim=32, n_group=1, topk_group=1, **common)
    return LlamaConfig(intermediate_size=256, **common)


def scored_sequences(tokenizer) -> list[list[int]]:
    """Held-out text (WikiText lines after the calibration ones), 64 tokens each, scored teacher-forced."""
    lines = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line) > 300][20:24]
    return [tokenizer(line).input_ids[:64] for line in lines]


@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer):
    """written(family, scheme): the folder llm-compressor's oneshot made of a random `family` model, once each,
    and its own teacher-forced scores of scored_sequences (llmcompressor_reference.py)."""
    from helpers.models import save_random_model

    assert PYTHON.exists(), "run ./scripts/setup.sh: it makes .venv-llmcompressor, llm-compressor's own venv"
    root = tmp_path_factory.mktemp("llmcompressor")
    texts = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line) > 300][:16]
    request = json.dumps({"texts": texts, "score": scored_sequences(tokenizer)})

    @cache
    def base(family: str) -> Path:
        torch.manual_seed(0)
        return save_random_model(base_config(family, tokenizer), root / family, tokenizer)

    @cache
    def folder(family: str, scheme: str) -> tuple[Path, list[dict]]:
        out = root / f"{family}-{scheme}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        result = subprocess.run([str(PYTHON), str(REFERENCE), "oneshot", str(base(family)), str(out), scheme],
                                input=request, capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        [line] = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
        return out, json.loads(line.removeprefix("RESULT "))["scores"]

    return folder


def assert_greedy_is_transformers(folder: Path, tokenizer, attention_backend: str = "auto",
                                  prompts: list[str] = PROMPTS, tokens: int = TOKENS) -> None:
    """llmctl's greedy tokens of `prompts`, teacher-forced through transformers on the decompressed folder."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    from llmctl import LLM, SamplingParams

    outputs = LLM(str(folder), max_model_len=256, attention_backend=attention_backend).generate(
        prompts, SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True, logprobs=0))
    reference = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False)).eval()
    for prompt, output in zip(prompts, outputs):
        ids, made = tokenizer(prompt).input_ids, output.outputs[0]
        with torch.no_grad():
            logits = reference(torch.tensor([ids + list(made.token_ids)])).logits[0, len(ids) - 1:-1]
        logprobs = logits.float().log_softmax(-1)
        chosen = logprobs[torch.arange(tokens), torch.tensor(made.token_ids)]
        assert (logprobs.max(-1).values - chosen).max() < 1e-3, prompt  # its argmax, or tied with it
        ours = torch.tensor([entry.logprob for entry in made.logprobs])
        assert (chosen - ours).abs().max() < 1e-3, prompt


@pytest.mark.parametrize("family, attention", [("llama", "auto"), ("qwen3_moe", "auto"), ("deepseek_v2", "auto"),
                                               ("llama", "triton")])
def test_w4a16_from_llm_compressor_generates_what_transformers_generates(family, attention, written, tokenizer):
    """`triton`: the GPU attention kernels, in Triton's interpreter on this CPU (two prompts, 8 tokens: the
    interpreter takes minutes for all of them)."""
    folder, _ = written(family, "W4A16")
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized" and config["config_groups"]["group_0"]["weights"]["actorder"]
    if attention == "triton":
        assert_greedy_is_transformers(folder, tokenizer, attention, PROMPTS[:2], 8)
    else:
        assert_greedy_is_transformers(folder, tokenizer, attention)


def test_llm_compressor_w4a16_and_w8a8_stay_quantized_on_the_cpu_kernels(written):
    """llm-compressor's GPTQ records actorder "static" (the column order it visited; the groups stay contiguous):
    that changes nothing stored, so its folders run on the int4 and int8 kernels as compressed-tensors' own do;
    a mixture of experts' routed experts stay 4-bit codes too (DeepSeek's other weights dequantized: MLA)."""
    from llmctl import LLM
    from llmctl.engine.layers.coded_linear import CodedLinear
    from llmctl.engine.layers.moe import FusedMoE
    from llmctl.engine.layers.quant_linear import QuantLinear

    for family, moe_layers in (("qwen3_moe", 2), ("deepseek_v2", 1)):
        model = LLM(str(written(family, "W4A16")[0]), max_model_len=128).engine.executor.loaded.model
        experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
        assert len(experts) == moe_layers and all(m.coded is not None for m in experts), family

    model = LLM(str(written("llama", "W4A16")[0]), max_model_len=128).engine.executor.loaded.model
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 8 and all(layer.cpu_int4 is not None for layer in layers)
    model = LLM(str(written("llama", "W8A8")[0]), max_model_len=128).engine.executor.loaded.model
    layers = [m for m in model.modules() if isinstance(m, CodedLinear)]
    assert len(layers) == 8 and all(layer.coded is not None and layer.coded.per_token_kernel for layer in layers)


@pytest.mark.parametrize("scheme", ["W8A8", "FP8_DYNAMIC"])
def test_activation_schemes_from_llm_compressor_agree_teacher_forced(scheme, written, tokenizer):
    agreement, gaps = teacher_forced(written("llama", scheme)[0], tokenizer)
    assert agreement >= 0.95 and gaps[int(0.99 * len(gaps))] < 0.05 and gaps[-1] < 0.1, (agreement, gaps[-5:])


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_w4a16_agrees_with_llm_compressors_own_forward(family, written, tokenizer):
    """Against the quantized model llm-compressor holds after oneshot, before it saves it (its own per-expert
    linears for a mixture), on held-out text: top-1 choices the same (99 %: the random model's are near-ties),
    log-probabilities within 2e-3 — what llmctl serves from the folder is what llm-compressor made."""
    from llmctl import LLM, SamplingParams

    folder, reference = written(family, "W4A16")
    outputs = LLM(str(folder), max_model_len=128).generate(
        [{"prompt_token_ids": ids} for ids in scored_sequences(tokenizer)],
        SamplingParams(max_tokens=1, prompt_logprobs=1))
    agree, gaps = 0, []
    for output, theirs in zip(outputs, reference):
        for i, (best, logprob) in enumerate(zip(theirs["argmax"], theirs["logprobs"])):
            entry = output.prompt_logprobs[i + 1]
            ours = max(entry.top.items(), key=lambda item: item[1])[0] if entry.top else entry.token_id
            agree += ours == best
            gaps.append(abs(entry.logprob - logprob))
    print(f"{family}: {agree / len(gaps):.1%} top-1, largest gap {max(gaps):.2e}")
    assert agree >= 0.99 * len(gaps) and max(gaps) < 2e-3, (agree / len(gaps), max(gaps))
