"""bfloat16 on CPUs: the engine's bfloat16 path (llmctl's AMX panel GEMM where the CPU has AMX, else oneDNN's
packed linears; the C++ attention reading a bfloat16 cache, SDPA for prompts past its limit) against
transformers' own bfloat16 model of the same checkpoint, by vLLM's rule for runs whose rounding differs
(tests/greedy_close.py; vLLM's model tests compare its bfloat16 runs with HF's that way)."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels import cpu


def onednn_packs_bfloat16() -> bool:
    """Whether this torch's oneDNN reorders a bfloat16 weight on this CPU (without AVX512-BF16 it may not: then
    nothing is packed and torch's own linears run the model)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.randn(64, 64).bfloat16(), None)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("amx", [True, pytest.param(False, marks=pytest.mark.skipif(
    not cpu.bf16_amx_supported(), reason="no AMX here: the first case ran the AVX512-BF16 panels"))],
    ids=["amx-where-present", "avx512-bf16"])
def test_bfloat16_engine_agrees_with_transformers_bfloat16(amx, default_source, record_property, monkeypatch):
    from transformers import AutoModelForCausalLM

    from helpers.greedy_close import assert_greedy_close, llmctl_greedy, transformers_greedy
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.layers import cpu_gemm
    from llmctl.engine.sampling_params import SamplingParams
    from llmctl.kernels.limits import HALF_VECTOR_QUERY_LIMIT

    if not amx:
        monkeypatch.setenv(cpu_gemm.AMX_ENV, "0")  # as on a Zen 4: AVX512-BF16 without AMX
    folder = str(resolve_model(None, weights=True, show_progress=False).path)
    llm = LLM(folder, dtype="bfloat16", max_model_len=512, kv_cache_memory=64 << 20)
    try:
        loaded = llm.engine.executor.loaded
        tokenizer = loaded.tokenizer
        assert next(loaded.model.parameters()).dtype == torch.bfloat16
        expected_kernel = ("llmctl's AMX bfloat16 GEMM" if amx and cpu.bf16_amx_supported() else
                           "llmctl's AVX512-BF16 bfloat16 GEMM" if cpu.bf16_panels_supported() else
                           "oneDNN's CPU GEMMs" if onednn_packs_bfloat16() else cpu_gemm.NOTHING_PACKED)
        assert cpu_gemm.packed_kernel() == expected_kernel
        long_prompt = "List the planets of the solar system in order, with one fact about each. " * 6
        prompts = ["The capital of France is", "def fibonacci(n):", long_prompt]
        ids = [tokenizer(p)["input_ids"] for p in prompts]
        assert len(ids[0]) <= HALF_VECTOR_QUERY_LIMIT < len(ids[2])  # the kernel's prefill, and SDPA's
        outputs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=5))
    finally:
        llm.shutdown()
    record_property("ran", f"bfloat16 engine ran: {expected_kernel}")
    reference = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
    agreed = [assert_greedy_close(llmctl_greedy(output.outputs[0]), transformers_greedy(reference, prompt, 12, 5),
                                  str(prompt[:8]))
              for prompt, output in zip(ids, outputs)]
    assert min(agreed) >= 3, agreed  # a trained model's first tokens are not near-ties
