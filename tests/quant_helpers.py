"""A quantized checkpoint's weights as dense float32, unpacked by the formats module (a path
independent of the engine's QuantLinear), for transformers to run as the reference."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

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
