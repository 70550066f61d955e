"""A quantized checkpoint's weights as dense float32, unpacked by the formats module (a path
independent of the engine's QuantLinear), for transformers to run as the reference."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from helpers.paths import FIXTURES

METADATA = (".qzeros", ".scales", ".g_idx")


def dequantized_state(out: Path, unpack: Callable) -> dict[str, torch.Tensor]:
    """Every tensor of out/model.safetensors: packed linears unpacked and dequantized, the rest as stored."""
    from safetensors.torch import load_file

    tensors = load_file(str(out / "model.safetensors"))
    state = {}
    for name, tensor in tensors.items():
        if name.endswith(".qweight"):
            base = name.removesuffix(".qweight")
            parts = {k: tensors[f"{base}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")
                     if f"{base}.{k}" in tensors}
            state[f"{base}.weight"] = unpack(parts).dequantize()
        elif not name.endswith(METADATA):
            state[name] = tensor.float()
    return state


def load_dense_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load `state` into a transformers model: every key must land, and only a tied lm_head may be absent
    (load_state_dict(strict=False) alone would ignore any mismatched key)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    assert not unexpected, f"keys the model does not have: {unexpected}"
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), f"keys the state lacks: {missing}"
    model.tie_weights()


WIKITEXT = FIXTURES / "data" / "wikitext-2-raw-test.hfdatasets-derived.crlf.txt"


def assert_engine_matches_dense(out: Path, unpack, prompt: str, dense_model=None):
    """The engine's greedy tokens and logprobs on the packed checkpoint == transformers on weights unpacked
    by the formats module (an independent path from the engine's QuantLinear). dense_model(folder, state)
    builds the reference from the unquantized config in `folder`; by default from_config + the state."""
    from helpers.quant_helpers import dequantized_state
    from llmctl import LLM, SamplingParams

    state = dequantized_state(out, unpack)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config")
    dense = out.parent / f"{out.name}-dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(config))
    model = (dense_model or _dense_model)(dense, state)
    llm = LLM(str(out), max_model_len=256)
    ours = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0))[0]
    ids = llm.get_tokenizer()(prompt, return_tensors="pt").input_ids
    tokens = ours.outputs[0].token_ids
    # Teacher-forced on the engine's tokens (one transformers forward over prompt + output), every
    # greedy choice is transformers' argmax (exactly, or within float noise where two tokens tie)
    # and every log-probability matches. (transformers' own generate() is not the reference here:
    # with the dense weights it has been seen to pick a token 0.8 nats below its own argmax.)
    with torch.no_grad():
        logits = model(torch.tensor([ids[0].tolist() + tokens])).logits[0, ids.shape[1] - 1:-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)]
    assert (logprobs.max(dim=-1).values - chosen).max() < 1e-3
    assert torch.allclose(chosen, torch.tensor([t.logprob for t in ours.outputs[0].logprobs]), atol=1e-3)
    return llm


def _dense_model(folder: Path, state: dict) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from helpers.quant_helpers import load_dense_state

    # eager attention: it is exact for every family, and the only one with Gemma 2's soft-cap
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=torch.float32,
                                             attn_implementation="eager").eval()
    load_dense_state(model, state)
    return model
