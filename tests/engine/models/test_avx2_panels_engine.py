"""The float32 engine on llmctl's AVX2 panel GEMM (the path CPUs without AVX-512 take; forced here with
LLMCTL_PANEL_ISA=avx2 where the CPU has both), against transformers' float32 model of the same checkpoint:
greedy tokens identical and log-probabilities close. Decode steps of several rows run the AVX2 panels, the
long prompt's step (past AVX2_PANEL_ROWS) runs plain F.linear."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels import cpu

pytestmark = pytest.mark.skipif("avx2" not in cpu.panel_isas(), reason="this CPU has no AVX2/FMA")


def test_float32_engine_on_avx2_panels_equals_transformers(default_source, monkeypatch, record_property):
    from transformers import AutoModelForCausalLM

    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.layers import cpu_gemm
    from llmctl.engine.sampling_params import SamplingParams

    monkeypatch.setenv(cpu_gemm.PANEL_ISA_ENV, "avx2")
    folder = str(resolve_model(None, weights=True, show_progress=False).path)
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at", "My favourite colour is",
               "List the planets of the solar system in order, with one fact about each of them. " * 3]
    llm = LLM(folder, dtype="float32", max_model_len=256, kv_cache_memory=64 << 20, enable_prefix_caching=False)
    try:
        assert cpu_gemm.packed_kernel().startswith("llmctl's AVX2 float32 GEMM")
        ids = [llm.engine.executor.loaded.tokenizer(p)["input_ids"] for p in prompts]
        assert sum(len(i) for i in ids) >= cpu_gemm.AVX2_PANEL_ROWS  # the prompt step runs plain F.linear
        outputs = llm.generate(prompts, SamplingParams(max_tokens=10, min_tokens=10, temperature=0, logprobs=0))
    finally:
        llm.shutdown()
    record_property("ran", f"float32 engine ran: {cpu_gemm.packed_kernel()}")
    reference = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    for prompt, output in zip(ids, outputs):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, min_new_tokens=10,
                                     output_logits=True, return_dict_in_generate=True)
        expected = out.sequences[0, len(prompt):].tolist()
        want = [torch.log_softmax(logits[0].float(), -1)[token].item() for token, logits in zip(expected, out.logits)]
        assert list(output.outputs[0].token_ids) == expected
        got = [entry.logprob for entry in output.outputs[0].logprobs]
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3
