"""Layers that keep a recurrent state instead of per-token K/V — Mamba / Mamba2 mixers, gated-DeltaNet linear
attention, short convolutions — read from config.json as each family writes them: Mamba's model types,
`layer_types` (Qwen3-Next, Qwen3.5, Granite 4.0-H, LFM2), Nemotron-H's `hybrid_override_pattern` (or
`layers_block_type`), Jamba's attention period, Falcon-H1's Mamba beside attention in every layer. llmctl neither serves such layers nor
sizes their state yet; knowing them keeps `plan` and `inspect` from counting them as attention."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALL_MAMBA = {"mamba": "Mamba", "mamba2": "Mamba2", "falcon_mamba": "Mamba", "falcon_h1": "Mamba2 (beside attention)"}
ATTENTION_TYPES = ("attention", "full", "sliding", "chunked")  # layer_types naming K/V attention


@dataclass(frozen=True)
class RecurrentLayers:
    layers: tuple[int, ...]
    kinds: tuple[str, ...]  # what keeps the state, as the config names it
    total: int  # the model's layers (blocks, for Nemotron-H)

    def describe(self) -> str:
        shown = ", ".join(map(str, self.layers[:8])) + (", …" if len(self.layers) > 8 else "")
        return f"{len(self.layers)} of {self.total} layers ({shown}) are {' / '.join(self.kinds)}"


def _is_recurrent(kind: str) -> bool:
    """A layer_types entry that is not K/V attention: mamba, conv, recurrent, and linear_attention (a state)."""
    return kind == "linear_attention" or not any(word in kind for word in ATTENTION_TYPES)


def recurrent_layers(cfg: dict[str, Any], model_type: str, num_layers: int) -> RecurrentLayers | None:
    """The layers with a recurrent state, or None for a model whose every layer attends."""
    if model_type in ALL_MAMBA:
        return RecurrentLayers(tuple(range(num_layers)), (ALL_MAMBA[model_type],), num_layers)
    found: dict[int, str] = {}
    total = num_layers
    layer_types = cfg.get("layer_types")
    interval = cfg.get("full_attention_interval")
    if not isinstance(layer_types, list) and model_type == "qwen3_next" and isinstance(interval, int) and interval > 0:
        # Qwen3-Next's published configs: every interval-th layer attends, the others are linear attention
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    if isinstance(layer_types, list):
        found = {i: str(kind) for i, kind in enumerate(layer_types) if _is_recurrent(str(kind))}
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):  # Nemotron-H's published configs: M Mamba, * attention, - MLP, E experts
        found |= {i: "mamba" for i, kind in enumerate(pattern) if kind == "M"}
    blocks = cfg.get("layers_block_type")
    if isinstance(blocks, list):  # Nemotron-H as transformers writes it: its Mamba blocks as linear_attention
        found |= {i: str(kind) for i, kind in enumerate(blocks) if str(kind) in ("mamba", "linear_attention")}
        total = max(total, len(blocks))
    period = cfg.get("attn_layer_period")
    if model_type == "jamba" and isinstance(period, int) and period > 0:
        offset = int(cfg.get("attn_layer_offset") or 0)
        found |= {i: "mamba" for i in range(num_layers) if i % period != offset}
    if not found:
        return None
    layers = tuple(sorted(found))
    return RecurrentLayers(layers, tuple(dict.fromkeys(found[i] for i in layers)), max(total, layers[-1] + 1))
