"""Decode steps of Llama-shaped GGUF, GPTQ/AWQ, W8A8 and float32 layers as one C++ call per layer (llmctl/engine/models/coded_decode.py):
the same ops as the Python layer in the same order, so the same tokens and the same log-probabilities to the
bit; which layers qualify. The Python layer itself is checked against transformers in test_gguf_coded.py, and
tensor parallelism (which never fuses: a rank's partial sums need an all-reduce) against one process there."""

from __future__ import annotations

import pytest

from llmctl.kernels import cpu

needs_kernels = pytest.mark.skipif(cpu.unavailable_reason() is not None,
                                   reason=f"C++ kernels not built: {cpu.unavailable_reason()}")
PROMPTS = [[1, 450, 701, 112, 318], [200, 17, 1000, 4, 5, 6, 7], [9, 8, 7]]


@pytest.fixture(autouse=True)
def int8_activations(monkeypatch):
    """GGUF weights with int8 activations, the engine's default (conftest sets float32 for other tests)."""
    monkeypatch.setenv("LLMCTL_GGUF_ACTIVATIONS", "int8")


def both_ways(path, **engine) -> tuple[int | None, list, list]:
    """(layers run fused, outputs fused, outputs through the Python layers) of one engine."""
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    llm = LLM(str(path), max_model_len=128, kv_cache_memory=16 << 20, **engine)
    try:
        params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=3)
        prompts = [{"prompt_token_ids": p} for p in PROMPTS]
        fused = llm.generate(prompts, params)
        model = llm.engine.executor.loaded.model
        layers = len(model.coded_layers) if model.coded_layers else None
        model.coded_layers = None  # from here on every layer runs in Python
        python = llm.generate(prompts, params)
    finally:
        llm.shutdown()
    return layers, fused, python


@needs_kernels
@pytest.mark.parametrize("arch, qtype", [("llama", "Q4_0"), ("qwen2", "Q8_0"), ("llama", "Q4_1")])
def test_fused_decode_layers_give_the_python_layers_tokens_and_logprobs_exactly(arch, qtype, default_source,
                                                                                 tmp_path):
    from helpers.gguf_models import write_tiny_gguf

    path = tmp_path / f"tiny-{arch}.{qtype}.gguf"
    write_tiny_gguf(arch, path, default_source.gguf_path, qtype)
    layers, fused, python = both_ways(path)
    assert layers is not None and layers > 0  # qwen2's QKV bias qualifies too
    for a, b in zip(fused, python):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [e.logprob for e in a.outputs[0].logprobs] == [e.logprob for e in b.outputs[0].logprobs]
        assert [e.top for e in a.outputs[0].logprobs] == [e.top for e in b.outputs[0].logprobs]


@needs_kernels
@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16"])  # float16: test_kv_cache_dtype.py
def test_fused_decode_layers_over_a_half_precision_kv_cache(kv_cache_dtype, default_source, tmp_path):
    # --kv-cache-dtype float16 (llama.cpp's default cache type): the fused layers still run, as the Python ones
    from helpers.gguf_models import write_tiny_gguf

    path = tmp_path / "tiny-llama.Q4_1.gguf"
    write_tiny_gguf("llama", path, default_source.gguf_path, "Q4_1")
    layers, fused, python = both_ways(path, kv_cache_dtype=kv_cache_dtype)
    assert layers is not None and layers > 0
    for a, b in zip(fused, python):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [e.logprob for e in a.outputs[0].logprobs] == [e.logprob for e in b.outputs[0].logprobs]


@needs_kernels
@pytest.mark.parametrize("arch, engine, why", [
    ("qwen3", {}, "q/k norms are not in the fused layer"),
    ("llama", {"dtype": "bfloat16"}, "the fused layer is float32's"),
])
def test_layers_that_do_not_qualify_run_in_python(arch, engine, why, default_source, tmp_path):
    from helpers.gguf_models import write_tiny_gguf
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    path = tmp_path / f"tiny-{arch}.Q4_0.gguf"
    write_tiny_gguf(arch, path, default_source.gguf_path, "Q4_0")
    llm = LLM(str(path), max_model_len=128, kv_cache_memory=16 << 20, **engine)
    try:
        [out] = llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=3, temperature=0))
        assert len(out.outputs[0].token_ids) == 3
        assert not llm.engine.executor.loaded.model.coded_layers, why
    finally:
        llm.shutdown()


@needs_kernels
@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_gptq_and_awq_layers_fused_give_the_python_layers_results_exactly(method, default_source, tmp_path):
    """4-bit GPTQ/AWQ weights repacked for the CPU (float activations) run fused through int4_linear."""
    from transformers import AutoTokenizer, LlamaConfig

    from helpers.models import quantized_model, random_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)
    folder = quantized_model(random_model(config, tmp_path / "llama", tokenizer), method, tokenizer, tmp_path)
    layers, fused, python = both_ways(folder)
    assert layers == 3
    for a, b in zip(fused, python):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [e.logprob for e in a.outputs[0].logprobs] == [e.logprob for e in b.outputs[0].logprobs]


@needs_kernels
@pytest.mark.parametrize("preset", ["W8A8", "W8A16"])
def test_int8_layers_fused_give_the_python_layers_results_exactly(preset, default_source, tmp_path):
    """A compressed-tensors checkpoint's int8 weights run fused: W8A8 through q8_linear's per-token mode, W8A16
    through int8_linear."""
    from transformers import AutoTokenizer

    from helpers.compressed import base_model, compressed_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    folder = compressed_checkpoint(base_model(tmp_path / "base", tokenizer), preset, tmp_path / preset, tokenizer)
    layers, fused, python = both_ways(folder)
    assert layers == 2
    for a, b in zip(fused, python):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [e.logprob for e in a.outputs[0].logprobs] == [e.logprob for e in b.outputs[0].logprobs]


@needs_kernels
@pytest.mark.parametrize("panels_from", [1, 4])  # 1: every step through llmctl's panels; 4: torch's linear below
def test_float32_layers_fused_give_the_python_layers_results_exactly(panels_from, default_source, tmp_path,
                                                                      monkeypatch):
    """A float32 checkpoint's layers fused: panel_linear or torch's linear, as cpu_gemm.linear picks per step."""
    from transformers import AutoTokenizer, LlamaConfig

    from helpers.models import random_model
    from llmctl.engine.layers import cpu_gemm

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)
    folder = random_model(config, tmp_path / "llama", tokenizer)
    monkeypatch.setattr(cpu_gemm, "measure_small_batch", lambda weight, packed: panels_from)
    layers, fused, python = both_ways(folder, dtype="float32")
    assert layers == 3
    for a, b in zip(fused, python):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert [e.logprob for e in a.outputs[0].logprobs] == [e.logprob for e in b.outputs[0].logprobs]
