"""`--kv-cache-dtype bfloat16|float16` (vLLM's names) under a float32 model on a CPU: K and V rounded to 16 bits as
they are stored, so a decode step reads half the cache bytes (llama.cpp keeps its cache in float16 by default).
The reference is transformers' float32 model with a cache that rounds K and V the same way as it stores them:
greedy tokens identical, log-probabilities close. And what is refused, in one line."""

from __future__ import annotations

import pytest
import torch

from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.kernels import cpu

needs_kernels = pytest.mark.skipif(cpu.unavailable_reason() is not None,
                                   reason=f"C++ kernels not built: {cpu.unavailable_reason()}")
TOLERANCE = {"float16": 2e-3, "bfloat16": 2e-2}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "List the planets of the solar system in order. " * 4]


def rounding_cache(dtype: torch.dtype):
    """transformers' DynamicCache keeping K and V as `dtype` would hold them (attention reads the rounded ones)."""
    from transformers import DynamicCache

    class Rounding(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return super().update(key_states.to(dtype).float(), value_states.to(dtype).float(), layer_idx,
                                  *args, **kwargs)

    return Rounding()


@needs_kernels
# each type on one backend (the kernels' bfloat16 path runs in test_coded_decode.py and test_cpu_kernels.py)
@pytest.mark.parametrize("kv_cache_dtype, backend", [("float16", "cpu"), ("bfloat16", "torch")])
def test_a_half_precision_cache_under_float32_equals_transformers_rounding_its_cache(kv_cache_dtype, backend,
                                                                                    default_source, caplog):
    from transformers import AutoModelForCausalLM

    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    folder = str(resolve_model(None, weights=True, show_progress=False).path)
    with caplog.at_level("INFO", logger="llmctl"):
        llm = LLM(folder, dtype="float32", max_model_len=256, kv_cache_memory=32 << 20, enable_prefix_caching=False,
                  kv_cache_dtype=kv_cache_dtype, attention_backend=backend)
    try:
        assert llm.engine.executor.loaded.kv_caches[0].kv.dtype == getattr(torch, kv_cache_dtype)
        assert f"blocks of 16 tokens in {kv_cache_dtype};" in caplog.text  # the startup log says which
        ids = [llm.engine.executor.loaded.tokenizer(p)["input_ids"] for p in PROMPTS]
        outputs = llm.generate(PROMPTS, SamplingParams(max_tokens=12, min_tokens=12, temperature=0, logprobs=0))
    finally:
        llm.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    dtype = getattr(torch, kv_cache_dtype)
    for prompt, output in zip(ids, outputs):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                     cache=rounding_cache(dtype), output_logits=True,
                                     return_dict_in_generate=True)
        expected = out.sequences[0, len(prompt):].tolist()
        want = [torch.log_softmax(logits[0].float(), -1)[token].item() for token, logits in zip(expected, out.logits)]
        assert list(output.outputs[0].token_ids) == expected
        got = [entry.logprob for entry in output.outputs[0].logprobs]
        # K/V within float32's error of transformers' land on either side of a 16-bit rounding now and then: one
        # step of bfloat16 (2^-8 relative) moves a log-probability more than one of float16 (2^-11)
        assert max(abs(a - b) for a, b in zip(got, want)) < TOLERANCE[kv_cache_dtype]


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices():
    with pytest.raises(EngineConfigError, match="use auto, bfloat16, float16, fp8, fp8_e4m3"):
        EngineConfig(model="m", kv_cache_dtype="int4").validate()


@needs_kernels
def test_the_cpu_kernel_refuses_a_cache_narrower_than_a_16_bit_model_and_auto_falls_back_to_torch(default_source):
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.front.llm import LLM

    folder = str(resolve_model(None, weights=True, show_progress=False).path)
    with pytest.raises(EngineConfigError, match="under float32 models only; use --attention-backend torch"):
        LLM(folder, dtype="bfloat16", kv_cache_dtype="float16", attention_backend="cpu", kv_cache_memory=16 << 20,
            max_model_len=256)
    llm = LLM(folder, dtype="bfloat16", kv_cache_dtype="float16", kv_cache_memory=16 << 20, max_model_len=256)
    try:
        assert llm.engine.executor.loaded.backend.name == "torch"
    finally:
        llm.shutdown()


def test_the_triton_kernels_refuse_a_16_bit_cache_beside_another_model_dtype(default_source):
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.front.llm import LLM

    folder = str(resolve_model(None, weights=True, show_progress=False).path)
    with pytest.raises(EngineConfigError, match="the Triton kernels read a cache in the model's dtype .float32. or fp8"):
        LLM(folder, dtype="float32", kv_cache_dtype="bfloat16", attention_backend="triton", max_model_len=256,
            kv_cache_memory=16 << 20)
