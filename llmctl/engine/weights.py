"""Checkpoint tensors from safetensors files: single file or sharded with an index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch

from llmctl.errors import CorruptModelError


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise CorruptModelError(f"{index} is not a valid safetensors index: {exc}") from exc
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CorruptModelError(
            f"{folder} has no *.safetensors weights (PyTorch .bin checkpoints are not loaded: convert them "
            "with transformers' save_pretrained(safe_serialization=True))")
    return files


def iterate_tensors(folder: Path, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in safetensors_files(folder):
        if not path.exists():
            raise CorruptModelError(f"{path.name} is listed in the index but missing from {folder}")
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    tensor = handle.get_tensor(name)
                    yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor
        except SafetensorError as exc:
            raise CorruptModelError(f"{path} is not a readable safetensors file: {exc}") from exc
