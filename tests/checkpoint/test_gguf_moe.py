"""Mixture-of-experts GGUF files (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE), written with the gguf
library as llama.cpp writes them (tests/helpers/gguf_moe.py), against transformers running the weights the file
holds (gguf-py's own quantize-then-dequantize round trip): served dequantized (--dtype float32) and coded — the
experts kept as codes on the CPU kernels — the greedy tokens are transformers'; with int8 activations (llama.cpp's
numerics) they agree by vLLM's rule for quantized models."""

from __future__ import annotations

import pytest
import torch

from llmctl.engine.front.llm import LLM
from llmctl.engine.sampling_params import SamplingParams
from llmctl.errors import LlmctlError

PROMPTS = [[1, 450, 701, 112, 318], [200, 17, 1000, 4, 5, 6, 7]]


def transformers_tokens(model: torch.nn.Module, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                             pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe", "qwen3moe"])
def test_moe_gguf_served_dequantized_and_coded_gives_transformers_tokens(arch, default_source, tmp_path):
    from helpers.gguf_moe import write_moe_gguf
    from llmctl.engine.layers.moe import FusedMoE

    path = tmp_path / f"tiny-{arch}.Q8_0.gguf"
    reference = write_moe_gguf(arch, path, default_source.gguf_path)
    expected = [transformers_tokens(reference, prompt, 10) for prompt in PROMPTS]
    for dtype in ("float32", "auto"):  # auto on a CPU: the coded form
        llm = LLM(str(path), dtype=dtype, max_model_len=128, kv_cache_memory=16 << 20)
        try:
            layers = [m for m in llm.engine.executor.loaded.model.modules() if isinstance(m, FusedMoE)]
            assert len(layers) == 2 and all((m.coded is not None) == (dtype == "auto") for m in layers)
            outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                                   SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
        finally:
            llm.shutdown()
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected, (arch, dtype)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_moe_gguf_experts_with_int8_activations_as_llama_cpp(arch, default_source, tmp_path, monkeypatch):
    """Served as a user runs it (int8 activations, llama.cpp's numerics: the suite sets float32 elsewhere), the
    tokens agree with transformers' by vLLM's rule for quantized models."""
    from helpers.gguf_moe import write_moe_gguf
    from helpers.greedy_close import assert_greedy_close, llmctl_greedy, transformers_greedy

    monkeypatch.setenv("LLMCTL_GGUF_ACTIVATIONS", "int8")
    path = tmp_path / f"tiny-{arch}.Q8_0.gguf"
    reference = write_moe_gguf(arch, path, default_source.gguf_path)
    llm = LLM(str(path), max_model_len=128, kv_cache_memory=16 << 20)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                               SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5))
    finally:
        llm.shutdown()
    for prompt, output in zip(PROMPTS, outputs):
        with torch.no_grad():
            assert_greedy_close(llmctl_greedy(output.outputs[0]), transformers_greedy(reference, prompt, 8, 5), arch)


def test_a_coded_moe_gguf_split_over_ranks_is_one_line(default_source, tmp_path):
    from helpers.gguf_moe import write_moe_gguf

    path = tmp_path / "tiny-qwen2moe.Q8_0.gguf"
    write_moe_gguf("qwen2moe", path, default_source.gguf_path)
    with pytest.raises(LlmctlError, match="use --tp 1 without --enable-expert-parallel"):
        LLM(str(path), tensor_parallel_size=2, max_model_len=128, kv_cache_memory=16 << 20)
