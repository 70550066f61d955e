"""A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors), checked
against the base model it is to run on before any request can use it.

Every tensor `…layers.N.<parent>.<proj>.lora_A/B.weight` is mapped onto the slice of our
fused linear it belongs to (q/k/v → qkv_proj, gate/up → gate_up_proj). The scale
alpha / r (alpha / √r with rsLoRA; per module with PEFT's rank_pattern/alpha_pattern) is
folded into B at load, so a forward computes y = x Wᵀ + (x Aᵀ) Bᵀ.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.errors import AdapterError
from llmctl.errors import LlmctlError
from llmctl.sizing.lora import LoRATarget, lora_targets

if TYPE_CHECKING:  # torch is imported where tensors are read: `llmctl inspect ADAPTER` never pays for it
    import torch

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.*?)\.lora_(?P<ab>[AB])(?:\.[A-Za-z0-9_-]+)?\.weight$")
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")
# PEFT options that change the math beyond y += scale·(x Aᵀ) Bᵀ: refused rather than served wrongly.
UNSUPPORTED_OPTIONS = {"use_dora": "DoRA", "fan_in_fan_out": "fan_in_fan_out (Conv1D layers)",
                       "modules_to_save": "modules_to_save (fully trained copies of base layers)",
                       "trainable_token_indices": "trainable_token_indices", "layer_replication": "layer_replication",
                       "target_parameters": "target_parameters", "lora_bias": "lora_bias"}
_cache_salts = itertools.count(1)


@dataclass(frozen=True)
class AdapterConfig:
    """What adapter_config.json says, in the terms llmctl uses."""

    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...] | str  # names, or one regex
    base_model: str | None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)

    def scale(self, module: str, rank: int) -> float:
        """PEFT's scaling for one module (its full name without the base_model.model. prefix)."""
        alpha = float(self.alpha_pattern[_pattern_key(self.alpha_pattern, module)]) \
            if _pattern_key(self.alpha_pattern, module) is not None else self.alpha
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def _pattern_key(patterns: dict, module: str) -> str | None:
    """PEFT's rule: a pattern key applies to a module whose name ends with it (after a dot)."""
    return next((key for key in patterns if re.match(rf"(.*\.)?({key})$", module)), None)


@dataclass
class SliceWeights:
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r], scale folded in


@dataclass(eq=False)  # compared and hashed by identity: a reload is another adapter
class LoRAAdapter:
    """An adapter in host memory, ready to be copied into a slot."""

    name: str
    path: Path
    config: AdapterConfig
    rank: int  # the largest rank of its modules
    targets: tuple[str, ...]  # PEFT module names it adapts, e.g. ("q_proj", "v_proj")
    weights: dict[tuple[int, str], list[SliceWeights | None]]  # (layer, fused module) -> per slice
    num_params: int
    cache_salt: int = field(default_factory=lambda: next(_cache_salts))  # unique per load: prefix-cache root

    @property
    def nbytes(self) -> int:
        return sum(s.a.nbytes + s.b.nbytes for slices in self.weights.values() for s in slices if s is not None)


def read_adapter_config(path: Path) -> AdapterConfig:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise AdapterError(f"{path} is not a PEFT LoRA adapter: it has no {CONFIG_FILE}")
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{file} cannot be read as JSON: {exc}") from None
    if str(raw.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{path} is a {raw['peft_type']} adapter; llmctl serves LoRA adapters only")
    for key, what in UNSUPPORTED_OPTIONS.items():
        if raw.get(key):
            raise AdapterError(f"{path} uses {what}, which llmctl's LoRA layers do not compute: merge it into the "
                               "base model (peft's merge_and_unload) and serve the merged model")
    if raw.get("bias", "none") != "none":
        raise AdapterError(f"{path} trains biases (bias={raw['bias']!r}), which llmctl's LoRA layers do not add: "
                           "merge it into the base model and serve the merged model")
    try:
        rank, alpha = int(raw["r"]), float(raw.get("lora_alpha", raw["r"]))
    except (KeyError, TypeError, ValueError):
        raise AdapterError(f"{file} has no valid rank 'r'") from None
    targets = raw.get("target_modules") or ()
    return AdapterConfig(rank, alpha, bool(raw.get("use_rslora")),
                         targets if isinstance(targets, str) else tuple(sorted(targets)),
                         raw.get("base_model_name_or_path"), dict(raw.get("rank_pattern") or {}),
                         dict(raw.get("alpha_pattern") or {}))


@dataclass(frozen=True)
class _Entry:
    """One lora_A or lora_B tensor, placed: which layer, fused module and slice."""

    key: str
    module: str  # full name, e.g. model.layers.0.self_attn.q_proj
    layer: int
    target: LoRATarget
    slice: int
    kind: str  # "A" or "B"
    rows: tuple[int, int] | None = None  # a B trained on a fused projection (Phi-3's qkv_proj): this slice's rows


def place_tensors(keys: Iterable[str], spec: ModelSpec, path: Path, base_model: str | None) -> list[_Entry]:
    """Map every tensor name onto our fused layers, or say why the adapter does not fit."""
    targets = lora_targets(spec)
    by_slice = {(t.module.split(".")[0], name): (t, i) for t in targets for i, name in enumerate(t.slices)}
    fused = {tuple(t.module.split(".")): t for t in targets if len(t.slices) > 1}  # Phi-3 trains these whole
    served = sorted({name for t in targets for name in t.slices})
    made_for = f" (it was made for {base_model})" if base_model else ""
    entries, unserved = [], set()
    for key in keys:
        match = KEY.match(key)
        layer = LAYER.search(match["module"]) if match else None
        if layer is None:
            unserved.add(key)
            continue
        parts = tuple(layer[2].split("."))
        place = by_slice.get((parts[0], parts[-1])) if len(parts) == 2 else None
        whole = fused.get(parts) if place is None and spec.model_type == "phi3" else None
        if place is None and whole is None:
            unserved.add(layer[2])
            continue
        index = int(layer[1])
        if index >= spec.num_layers:
            raise AdapterError(f"{path} adapts layer {index}, but the base model has {spec.num_layers} layers: it "
                               f"does not fit this model{made_for}")
        if whole is None:
            entries.append(_Entry(key, match["module"], index, place[0], place[1], match["ab"]))
        else:  # one A for every slice, and each slice's rows of B: the same delta, slice by slice
            entries += _fused_entries(key, match["module"], index, whole, match["ab"])
    if unserved:
        raise AdapterError(f"{path} adapts {', '.join(sorted(unserved)[:4])}, which llmctl's LoRA does not serve "
                           f"(it serves {', '.join(served)})")
    if not entries:
        raise AdapterError(f"{path} has no LoRA weights for any layer of this model: its target modules should be "
                           f"among {', '.join(served)}")
    return entries


def _fused_entries(key: str, module: str, layer: int, target: LoRATarget, kind: str) -> list[_Entry]:
    starts = [sum(target.slice_outs[:i]) for i in range(len(target.slices))]
    return [_Entry(key, module, layer, target, i, kind, None if kind == "A" else (start, start + out))
            for i, (start, out) in enumerate(zip(starts, target.slice_outs))]


def check_shapes(entries: list[_Entry], shapes: dict[str, tuple[int, ...]], path: Path,
                 base_model: str | None) -> dict[tuple[int, str, int], int]:
    """Each A is [r, in] and each B [out, r] for the base model's sizes: (layer, module, slice) -> r."""
    made_for = f" (it was made for {base_model})" if base_model else ""
    ranks: dict[tuple[int, str, int], int] = {}
    for e in entries:
        shape = shapes[e.key]
        need = e.target.in_features if e.kind == "A" else \
            (sum(e.target.slice_outs) if e.rows else e.target.slice_outs[e.slice])
        size = shape[1] if e.kind == "A" else shape[0]
        if len(shape) != 2 or size != need:
            expected = f"[r, {need}]" if e.kind == "A" else f"[{need}, r]"
            raise AdapterError(f"{path} does not fit this base model{made_for}: {e.module}.lora_{e.kind} is "
                               f"{list(shape)}, the base model needs {expected}")
        rank = shape[0] if e.kind == "A" else shape[1]
        slot = (e.layer, e.target.module, e.slice)
        if ranks.setdefault(slot, rank) != rank:
            raise AdapterError(f"{path}: {e.module} has lora_A and lora_B of different ranks")
    kinds = {(e.layer, e.target.module, e.slice, e.kind) for e in entries}
    lone = sorted(f"layer {layer} {t}" for layer, t, s, k in kinds if (layer, t, s, "B" if k == "A" else "A")
                  not in kinds)
    if lone:
        raise AdapterError(f"{path} has lora_A without lora_B (or the reverse) at {', '.join(lone[:3])}")
    return ranks


@dataclass(frozen=True)
class AdapterReport:
    """What `llmctl inspect ADAPTER_DIR` shows."""

    path: Path
    config: AdapterConfig
    rank: int  # the largest of its modules
    targets: tuple[str, ...]
    layers: int  # decoder layers it adapts
    num_params: int
    nbytes: int
    fits: bool | None  # None: the base model could not be read here
    fit_note: str


def describe_adapter(path: Path) -> AdapterReport:
    """The adapter's facts from its config and safetensors header, and whether it fits its base model."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.safetensors import read_local_headers
    from llmctl.checkpoint.source import resolve_model

    config = read_adapter_config(path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        raise AdapterError(f"{path} has no {WEIGHTS_FILE}")
    headers = read_local_headers([file])
    shapes = {name: shape for name, (_, shape) in headers.items()}
    matches = {name: match for name in shapes if (match := KEY.match(name))}
    ranks = [shapes[name][0] for name, match in matches.items() if match["ab"] == "A"]
    layers = {int(found[1]) for match in matches.values() if (found := LAYER.search(match["module"]))}
    targets = tuple(sorted({match["module"].rsplit(".", 1)[-1] for match in matches.values()}))
    num_params = sum(math.prod(shape) for shape in shapes.values())
    nbytes = file.stat().st_size
    fits, note = None, "no base_model_name_or_path in adapter_config.json: serve it to check"
    if config.base_model:
        try:
            spec = load_spec(resolve_model(config.base_model, weights=False, show_progress=False))
            check_shapes(place_tensors(shapes, spec, path, config.base_model), shapes, path, config.base_model)
            fits, note = True, f"every tensor fits {config.base_model}"
        except AdapterError as exc:
            fits, note = False, str(exc)
        except LlmctlError as exc:
            note = f"{config.base_model} cannot be read here, so the fit is unchecked: {exc}"
    return AdapterReport(path, config, max(ranks, default=config.rank), targets, len(layers), num_params, nbytes,
                         fits, note)


def load_adapter(path: Path, name: str, spec: ModelSpec, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """Read, check and place an adapter: any mismatch is an AdapterError naming it."""
    import torch
    from safetensors import safe_open

    config = read_adapter_config(path)
    file = path / WEIGHTS_FILE
    if not file.is_file():
        other = "adapter_model.bin: save it with safe_serialization=True" if (path / "adapter_model.bin").is_file() \
            else "no weights"
        raise AdapterError(f"{path} has no {WEIGHTS_FILE} ({other})")
    with safe_open(str(file), "pt") as reader:
        keys = list(reader.keys())
        entries = place_tensors(keys, spec, path, config.base_model)
        shapes = {e.key: tuple(reader.get_slice(e.key).get_shape()) for e in entries}
        ranks = check_shapes(entries, shapes, path, config.base_model)
        rank = max(ranks.values())
        if rank > max_rank:
            raise AdapterError(f"{path} has rank {rank}, more than --max-lora-rank {max_rank}: start with "
                               f"--max-lora-rank {rank} (or more)")
        tensors = {e.key: reader.get_tensor(e.key) for e in entries}
    weights: dict[tuple[int, str], list[SliceWeights | None]] = {}
    pairs: dict[tuple[int, str, int], dict[str, _Entry]] = {}
    for e in entries:
        pairs.setdefault((e.layer, e.target.module, e.slice), {})[e.kind] = e
    for (layer, module, index), pair in pairs.items():
        a, b = tensors[pair["A"].key], tensors[pair["B"].key]
        if pair["B"].rows:
            b = b[pair["B"].rows[0]:pair["B"].rows[1]]
        scale = config.scale(pair["A"].module, a.shape[0])
        slices = weights.setdefault((layer, module), [None] * len(pair["A"].target.slices))
        slices[index] = SliceWeights(a.to(torch.float32).to(dtype).contiguous(),
                                     (b.to(torch.float32) * scale).to(dtype).contiguous())
    names = tuple(sorted({e.target.slices[e.slice] for e in entries}))
    return LoRAAdapter(name, path, config, rank, names, weights, sum(t.numel() for t in tensors.values()))
