"""fp8 checkpoints kept as float8 (the GPU form, llmctl.engine.layers.quant_linear's fp8 method), run here on a CPU
by letting the registry choose that form (`keeps_fp8`, which says yes only for CUDA): the K-major bytes and column
scales the loader makes of a block-wise FP8 Llama (transformers' own FineGrainedFP8 quantizer, fused q/k/v and
gate/up parts) give the tokens and log-probabilities of the dequantized-at-load form, and the FP8 W8A16 Triton
kernel (in the interpreter) on a loaded layer equals the layer's dequantized weight."""

from __future__ import annotations

import pytest
import torch

from helpers.compressed import base_model, fp8_block_checkpoint
from helpers.families import PROMPTS
from llmctl import LLM, SamplingParams
from llmctl.engine.layers.quant_linear import QuantLinear


@pytest.fixture(scope="module")
def fp8_folder(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("fp8-kept")
    return fp8_block_checkpoint(base_model(root / "base", tokenizer), root / "fp8", block=32)


def _generate(folder, keep: bool, monkeypatch) -> tuple[list, LLM]:
    monkeypatch.setattr("llmctl.engine.models.registry.keeps_fp8", lambda device_type: keep)
    llm = LLM(str(folder), max_model_len=128)
    outputs = llm.generate(PROMPTS[:4], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0))
    return [(list(o.outputs[0].token_ids), [e.logprob for e in o.outputs[0].logprobs]) for o in outputs], llm


def test_fp8_kept_generates_what_the_dequantized_form_does(fp8_folder, monkeypatch, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="llmctl")
    expected, _ = _generate(fp8_folder, False, monkeypatch)
    ours, llm = _generate(fp8_folder, True, monkeypatch)
    assert "fp8 weights kept as float8" in caplog.text
    layers = [m for m in llm.engine.executor.loaded.model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 8 and all(m.method == "fp8" and m.qweight.dtype == torch.uint8 for m in layers)
    assert all(m.nbytes < m.in_features * m.out_features * 2 for m in layers)  # a byte a weight, and the scales
    for (tokens, logprobs), (their_tokens, their_logprobs) in zip(ours, expected):
        assert tokens == their_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, their_logprobs)) < 1e-4
    qkv = next(m for m in layers if m.out_features > m.in_features)  # fused q/k/v: three parts' columns
    x = torch.randn(3, qkv.in_features)
    torch.testing.assert_close(qkv.forward_fp8(x), x @ qkv.dequantize().t(), rtol=1e-5, atol=1e-4)
