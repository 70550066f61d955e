"""Pieces shared by the model families: step context, the stage a rank runs, weight loading."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.attention import AttentionBackend, KVCache
from llmctl.engine.layers.linear import LoadError
from llmctl.engine.layers.recurrent_state import StateStep


@dataclass
class StepContext:
    """What every layer needs for one step besides its hidden states."""

    positions: torch.Tensor  # [T]
    kv_caches: dict[int, KVCache]  # by layer index: the layers this rank runs
    backend: AttentionBackend
    lengths: torch.Tensor | None = None  # [T] each token's sequence length after the step (LongRoPE models)
    input_embeds: torch.Tensor | None = None  # [T, hidden] in place of the token embeddings (images merged in)
    deepstack: torch.Tensor | None = None  # [T, k · hidden] image features added after the first k layers (Qwen3-VL)
    states: StateStep | None = None  # recurrent layers' per-sequence state slots (Mamba2 mixers)


@dataclass(frozen=True)
class Shard:
    """The part of the model one process runs: its TP group and its pipeline stage's layers."""

    group: TPGroup = field(default_factory=TPGroup)
    layers: range | None = None  # None: every layer
    is_first: bool = True
    is_last: bool = True
    experts: ExpertPlacement | None = None  # MoE layers: whole experts per rank (expert parallel), not a slice of each

    def stage_layers(self, num_layers: int) -> range:
        return range(num_layers) if self.layers is None else self.layers


class WeightMismatchError(ValueError):
    """Checkpoint tensors do not fit the model built from config.json."""


@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a parameter path, and for fused layers which part (at which row)."""

    path: str
    part: int = 0
    offset: int | None = None  # None: the tensor is this part alone


def embedding_targets(name: str, embedding: nn.Module | None, lm_head: nn.Module | None,
                      tied: bool = True) -> list[Target]:
    """The embedding table (`weight`, or GGUF `codes`, `scales`, `offsets`) loads on the first stage; a tied
    head on another stage loads its own copy."""
    out = [Target(name)] if embedding is not None else []
    if tied and lm_head is not None and lm_head is not embedding:
        out.append(Target("lm_head." + name.rsplit(".", 1)[1]))
    return out


def layer_index(name: str, marker: str) -> int | None:
    """3 for 'model.layers.3.mlp...' with marker 'layers.'."""
    at = name.find(marker)
    if at < 0:
        return None
    digits = name[at + len(marker):].split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def load_checkpoint(model: nn.Module, tensors: Iterable[CheckpointTensor],
                    targets: Callable[[str], list[Target]]) -> None:
    """Read every tensor this rank needs (only its slices), then check nothing is missing."""
    modules = dict(model.named_modules())
    params = dict(model.named_parameters())
    received: set[tuple[str, str, int]] = set()
    try:
        for tensor in tensors:
            for target in targets(tensor.name):
                path, kind = target.path.rsplit(".", 1) if "." in target.path else ("", target.path)
                module = modules.get(path)
                if hasattr(module, "load"):
                    module.load(kind, tensor, target.part, target.offset)
                    received.add((path, kind, target.part))
                elif target.path in params:
                    _copy_whole(params[target.path], tensor)
                    received.add((target.path, "", 0))
        for module in modules.values():
            if hasattr(module, "finish_loading"):
                module.finish_loading()
    except (LoadError, ValueError) as exc:
        raise WeightMismatchError(str(exc)) from None
    missing = _missing(modules, params, received)
    if missing:
        raise WeightMismatchError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def _copy_whole(param: nn.Parameter, tensor: CheckpointTensor) -> None:
    if tuple(param.shape) != tuple(tensor.shape):
        raise WeightMismatchError(f"{tensor.name}: checkpoint shape {tuple(tensor.shape)}, model expects "
                                  f"{tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.read())


def _missing(modules: dict[str, nn.Module], params: dict[str, nn.Parameter],
             received: set[tuple[str, str, int]]) -> set[str]:
    loadable = {path for path, module in modules.items() if hasattr(module, "expected")}
    missing = {f"{path}.{kind}" for path in loadable for kind, part in modules[path].expected()
               if (path, kind, part) not in received}
    for name in params:
        owner = name.rsplit(".", 1)[0]
        if not any(owner == p or owner.startswith(p + ".") for p in loadable) and (name, "", 0) not in received:
            missing.add(name)
    return missing
