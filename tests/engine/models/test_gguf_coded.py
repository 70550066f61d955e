"""GGUF weights kept quantized: the codes read out of every kept block type against gguf-py's own
dequantizer, the C++ int8 kernel on every instruction-set path built here (the run's summary line names
them), fused layers of mixed types, and the default model's Q4_1 file served coded against transformers'
own GGUF loading of the same file."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.gguf_models import coded_weight, gguf_tensor, reference
from llmctl.checkpoint.gguf_codes import FORMATS, group_codes
from llmctl.engine.layers.coded_linear import DECODE_ROWS, CodedWeight
from llmctl.kernels import cpu

ISAS = cpu.int4_isas() if cpu.unavailable_reason() is None else []
needs_kernels = pytest.mark.skipif(not ISAS, reason=f"C++ kernels not built: {cpu.unavailable_reason()}")


@pytest.fixture(autouse=True)
def int8_activations(monkeypatch):
    """GGUF weights with int8 activations, the engine's default (conftest sets float32 for other tests)."""
    monkeypatch.setenv("LLMCTL_GGUF_ACTIVATIONS", "int8")


@pytest.mark.parametrize("type_name", sorted(FORMATS))
def test_codes_times_scale_plus_offset_is_gguf_py_dequantized_value(type_name):
    rows, columns = 6, 512
    raw = gguf_tensor(type_name, rows, columns, seed=len(type_name) + ord(type_name[1]))
    codes = group_codes(raw, type_name, rows, columns)
    group = codes.group_size
    weight = codes.codes.astype(np.float64) * np.repeat(codes.scales, group, 1) + np.repeat(codes.offsets, group, 1)
    np.testing.assert_allclose(weight, reference(raw, type_name).numpy().reshape(rows, columns), rtol=1e-6,
                               atol=1e-9)
    assert codes.bits == FORMATS[type_name][0] and group in (16, 32)


def test_types_not_kept_coded_are_left_to_the_caller():
    assert group_codes(np.zeros((2, 64), np.uint8), "F16", 2, 32) is None
    assert group_codes(np.zeros((2, 84), np.uint8), "Q2_K", 2, 256) is None


@needs_kernels
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_coded_linear_kernels_on_every_path_equal_the_dequantized_weight(isa, type_name):
    rows, columns = 40, 512
    raw = gguf_tensor(type_name, rows, columns, seed=7)
    weight, expected_weight = coded_weight(raw, type_name, rows, columns), reference(raw, type_name)
    kernel = cpu.int4_linear if weight.bits == 4 else cpu.int8_linear
    # GGUF stores Q4_1's and Q8_0's scale and offset in float16, so the kernels read them so (half the bytes);
    # the K-quants' are products of two of its numbers and stay float32: both kernels run both here
    assert weight.scales.dtype == (torch.float16 if type_name in ("Q4_1", "Q8_0") else torch.float32)
    for batch in (1, 3, 5):
        x = torch.randn(batch, columns, generator=torch.Generator().manual_seed(batch))
        out = kernel(x, weight.codes, weight.scales, weight.offsets, None, isa)
        bound = (x.double().abs() @ expected_weight.double().abs().t()).max().item()  # float32 summation's scale
        torch.testing.assert_close(out.double(), x.double() @ expected_weight.double().t(), rtol=1e-5,
                                   atol=1e-6 * bound)
    torch.testing.assert_close(weight.dequantize(), expected_weight, rtol=1e-6, atol=1e-9)


@needs_kernels
def test_int8_kernel_refuses_a_group_it_cannot_read():
    codes, scales = torch.zeros(4, 40, dtype=torch.int8), torch.ones(4, 5)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu.int8_linear(torch.zeros(1, 40), codes, scales, scales, None, "plain")


@needs_kernels
def test_a_fused_layer_of_mixed_types_widens_exactly():
    """q in Q4_K and v in Q6_K (as llama.cpp's Q4_K_M mixes them) share one layer as int8 codes in groups of 16."""
    parts = [("Q4_K", 32), ("Q6_K", 16), ("Q4_0", 24)]
    raws = [gguf_tensor(name, rows, 256, seed=rows) for name, rows in parts]
    stacked = CodedWeight.stacked([coded_weight(raw, name, rows, 256) for raw, (name, rows) in zip(raws, parts)])
    expected = torch.cat([reference(raw, name) for raw, (name, _) in zip(raws, parts)])
    assert (stacked.bits, stacked.group_size) == (8, 16)
    torch.testing.assert_close(stacked.dequantize(), expected, rtol=1e-6, atol=1e-9)
    x = torch.randn(DECODE_ROWS + 1, 256)  # through the decoded-once float GEMM
    torch.testing.assert_close(stacked.matmul(x), x @ expected.t(), rtol=1e-4, atol=1e-4)


@needs_kernels
@pytest.mark.subprocess
def test_the_default_gguf_served_coded_matches_transformers_reading_the_same_file(default_source):
    """`llmctl serve` of the default GGUF as a user runs it (int8 activations, as llama.cpp: the suite sets float32
    for its other tests, so this server drops that setting), through the openai client, against transformers' GGUF
    loading (which dequantizes the same file to float32), by vLLM's rule for quantized models (greedy_close); the
    startup log says the weights held are the file's codes, not a float copy."""
    import openai
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.greedy_close import assert_greedy_close, transformers_greedy
    from helpers.server_helpers import start_server
    from llmctl.engine.layers.coded_linear import GGUF_ACTIVATIONS_ENV

    gguf_path = default_source.gguf_path
    prompts = ["The capital of France is", "def fibonacci(n):"]
    server = start_server(str(gguf_path), "--max-model-len", "256", "--kv-cache-memory", "64MiB",
                          unset=(GGUF_ACTIVATIONS_ENV,))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        model = client.models.list().data[0].id
        choices = [client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=5,
                                             extra_body={"ignore_eos": True}).choices[0] for prompt in prompts]
    finally:
        server.stop()
    assert re.search(r"coded weights \(0\.0\d GiB\), \w+ kernels with int8 activations as llama.cpp", server.log), \
        server.log[-3000:]
    ours = [[(token, set(top)) for token, top in zip(choice.logprobs.tokens, choice.logprobs.top_logprobs)]
            for choice in choices]  # as the API gives them: each token's text and its top-5 texts
    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    reference_model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                           torch_dtype=torch.float32)

    def as_text(steps: list[tuple[int, set[int]]]) -> list[tuple[str, set[str]]]:
        return [(tokenizer.decode([token]), {tokenizer.decode([t]) for t in top}) for token, top in steps]

    agreed = [assert_greedy_close(tokens, as_text(transformers_greedy(reference_model, tokenizer(prompt)["input_ids"],
                                                                      12, 5)), prompt)
              for prompt, tokens in zip(prompts, ours)]
    assert min(agreed) >= 4, agreed  # a trained model's first tokens are not near-ties


def _file_mappings(suffix: str) -> list[tuple[int, int]]:
    ranges = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) > 5 and fields[5].endswith(suffix):
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_coded_weights_are_copies_so_the_checkpoint_map_is_released(default_source):
    # Views of the converted checkpoint's memory map kept every page of it resident (110 MiB for this model,
    # beside the fused copies): loaded, no weight lies in a mapped safetensors file, and none is mapped any more.
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.layers.coded_linear import CodedLinear
    from llmctl.engine.layers.linear import VocabParallelEmbedding

    llm = LLM(str(default_source.gguf_path), max_model_len=128, kv_cache_memory=16 << 20)
    try:
        model = llm.engine.executor.loaded.model
        coded = [m.coded for m in model.modules() if isinstance(m, (CodedLinear, VocabParallelEmbedding))
                 and m.coded is not None]
        assert len(coded) == 121  # 30 layers × 4 fused linears, and the embedding (tied to the output)
        assert _file_mappings(".safetensors") == []
    finally:
        llm.shutdown()


def test_inspect_shows_each_gguf_tensor_type_and_how_the_cpu_engine_runs_it(default_source):
    from llmctl.inspect_report import build_inspect_report

    types = {t.name: t for t in build_inspect_report(default_source).gguf_tensor_types}
    assert set(types) == {"Q4_1", "Q8_0", "F32"}
    assert sum(t.weights for t in types.values()) == 134_515_008  # SmolLM2-135M's published parameter count
    assert types["Q8_0"].weights == 49152 * 576 and types["Q8_0"].nbytes == 49152 * 576 // 32 * 34  # token_embd
    assert types["Q4_1"].kept_coded and types["Q8_0"].kept_coded and not types["F32"].kept_coded


GGUF_ARCHITECTURES = [("llama", "Q4_0"), ("qwen2", "Q8_0"), ("qwen3", "Q4_1"), ("phi3", "Q8_0"), ("gemma2", "Q5_0"),
                     ("gemma3", "Q4_1"), ("llama", "Q4_K_M")]  # Q4_K_M: random Q4_K and Q6_K blocks


@needs_kernels
@pytest.mark.parametrize("arch, qtype", GGUF_ARCHITECTURES)
def test_gguf_of_each_architecture_served_coded_matches_transformers(arch, qtype, default_source, tmp_path):
    """A random tiny model written as llama.cpp writes `arch` (weights in `qtype`) against transformers' own
    GGUF loading of the same file: served dequantized (--dtype float32) the greedy tokens are identical;
    served coded (int8 activations, as llama.cpp) they agree by vLLM's rule for quantized models."""
    from helpers.gguf_models import assert_served_as_transformers_reads_it, write_tiny_gguf

    path = tmp_path / f"tiny-{arch}.{qtype}.gguf"
    write_tiny_gguf(arch, path, default_source.gguf_path, qtype)
    assert_served_as_transformers_reads_it(path, arch)


@needs_kernels
def test_coded_gguf_split_over_two_tensor_parallel_ranks_equals_one_process(default_source, tmp_path):
    """TP 2 splits coded linears by output rows (q/k/v, gate/up), by input columns on block boundaries
    (o, down) and the coded vocabulary by rows: the same greedy tokens and logprobs as one process."""
    from helpers.gguf_models import write_tiny_gguf
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    path = tmp_path / "tiny-qwen2.Q4_0.gguf"
    write_tiny_gguf("qwen2", path, default_source.gguf_path, "Q4_0")
    results = []
    for tp in (1, 2):
        llm = LLM(str(path), tensor_parallel_size=tp, max_model_len=128, kv_cache_memory=16 << 20)
        try:
            [output] = llm.generate([{"prompt_token_ids": [1, 450, 701, 112, 318]}],
                                    SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0))
        finally:
            llm.shutdown()
        results.append((output.outputs[0].token_ids, [lp.logprob for lp in output.outputs[0].logprobs]))
    (tokens, logprobs), (tp_tokens, tp_logprobs) = results
    assert list(tp_tokens) == list(tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, tp_logprobs)) <= 1e-4
