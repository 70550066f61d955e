"""Perplexity of a model on held-out text, computed with transformers on given weights."""

from __future__ import annotations

import math
from pathlib import Path

import torch


def load_dense_model(folder: Path, state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The model of `folder` in float32, with `state` (e.g. dequantized weights) loaded over it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if state is None:
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True,
                                                    trust_remote_code=False).eval()
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    if config.get_text_config() is not config:  # multimodal: text is scored by its language model alone
        config, state = config.get_text_config(), _language_model_state(state)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def _language_model_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A multimodal checkpoint's language-model tensors under a text model's names (model.layers...)."""
    from llmctl.quant.families import language_model_prefix

    prefix = language_model_prefix(state)
    text = {"model." + name.removeprefix(prefix): tensor for name, tensor in state.items() if name.startswith(prefix)}
    heads = [name for name in state if name.endswith("lm_head.weight")]  # absent when tied (Gemma 3)
    return text | ({"lm_head.weight": state[heads[0]]} if heads else {})


@torch.no_grad()
def perplexity(model: torch.nn.Module, ids: list[int], seq_len: int = 512) -> float:
    """exp(mean negative log-likelihood) over non-overlapping windows of `seq_len` tokens."""
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, seq_len):
        window = torch.tensor([ids[start:start + seq_len + 1]])
        if window.shape[1] < 2:
            break
        logits = model(window[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
        total += float(loss)
        count += window.shape[1] - 1
    return math.exp(total / count)
