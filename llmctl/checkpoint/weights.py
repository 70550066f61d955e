"""Checkpoint tensors from safetensors files: single file or sharded with an index."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from llmctl.checkpoint.safetensors_read import stored_tensors
from llmctl.errors import CorruptModelError


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return _indexed(index)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if pickle_files(folder):
            raise CorruptModelError(
                f"{folder} has only pickled PyTorch .bin weights, which llmctl does not load by default (unpickling "
                "can run code): convert them with transformers' save_pretrained (it writes safetensors), or pass "
                "--allow-pickle-weights to load them with torch.load(weights_only=True)")
        raise CorruptModelError(f"{folder} has no *.safetensors weights")
    return files


def pickle_files(folder: Path) -> list[Path]:
    index = folder / "pytorch_model.bin.index.json"
    return _indexed(index) if index.exists() else sorted(folder.glob("pytorch_model*.bin"))


def _indexed(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError) as exc:
        raise CorruptModelError(f"{index} is not a valid weight index: {exc}") from exc
    return [index.parent / name for name in sorted(set(weight_map.values()))]


@dataclass
class CheckpointTensor:
    """One checkpoint tensor, read lazily: a tensor-parallel rank reads only its rows or columns,
    so no process ever holds the whole checkpoint."""

    name: str
    shape: tuple[int, ...]
    _reader: Callable[[tuple[slice, ...]], torch.Tensor]
    _dtype: torch.dtype  # floating-point tensors are converted to the model's dtype, but quantization scales

    @property
    def keeps_stored_dtype(self) -> bool:
        """GPTQ/AWQ scales stay as stored (float16): through bfloat16 they would lose 3 mantissa bits; GGUF
        groups' float32 scales and offsets likewise."""
        return self.name.endswith((".scales", ".offsets"))

    def read_stored(self) -> torch.Tensor:
        """The whole tensor in its stored dtype (float8 weights and their scales, decoded together)."""
        return self._reader(tuple(slice(None) for _ in self.shape))

    def read(self, dim: int | None = None, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The whole tensor, or [start, stop) along `dim`."""
        index = [slice(None)] * len(self.shape)
        if dim is not None:
            index[dim] = slice(start, self.shape[dim] if stop is None else stop)
        tensor = self._reader(tuple(index))
        return tensor.to(self._dtype) if tensor.is_floating_point() and not self.keeps_stored_dtype else tensor


def stored_dtypes(folder: Path) -> dict[str, str]:
    """Every tensor of a folder's safetensors files and its stored dtype (F8_E4M3, BF16, I32, ...), from the
    headers only."""
    from safetensors import safe_open

    dtypes: dict[str, str] = {}
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            dtypes.update((name, handle.get_slice(name).get_dtype()) for name in handle.keys())
    return dtypes


def iterate_tensors(folder: Path, dtype: torch.dtype, allow_pickle: bool = False) -> Iterator[CheckpointTensor]:
    """safetensors (read slice by slice); pickled .bin files only when allowed and nothing else is there.
    The files are found now, the tensors read as the iterator goes: a folder without weights fails before
    a model is built for it (on a GPU, building a large one would run out of memory first)."""
    if allow_pickle and not list(folder.glob("*.safetensors")) and pickle_files(folder):
        return _pickled_tensors(folder, dtype)
    files = safetensors_files(folder)
    for path in files:
        if not path.exists():
            raise CorruptModelError(f"{path.name} is listed in the index but missing from {folder}")
    return _safetensors_tensors(files, dtype)


def _safetensors_tensors(files: list[Path], dtype: torch.dtype) -> Iterator[CheckpointTensor]:
    """Read with pread (llmctl.checkpoint.safetensors_read: no memory map resident while loading); a file with a
    dtype that reader does not know, through the safetensors library."""
    from safetensors import SafetensorError, safe_open

    for path in files:
        stored = stored_tensors(path)
        if stored is not None:
            yield from (CheckpointTensor(name, tensor.shape, tensor, dtype) for name, tensor in stored.items())
            continue
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    part = handle.get_slice(name)
                    yield CheckpointTensor(name, tuple(part.get_shape()), part.__getitem__, dtype)
        except SafetensorError as exc:
            raise CorruptModelError(f"{path} is not a readable safetensors file: {exc}") from exc


def _pickled_tensors(folder: Path, dtype: torch.dtype) -> Iterator[CheckpointTensor]:
    for path in pickle_files(folder):
        try:  # weights_only: torch's restricted unpickler, tensors and plain containers only
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            raise CorruptModelError(f"{path} is not a loadable PyTorch weights file: {exc}") from exc
        for name, tensor in state.items():
            yield CheckpointTensor(name, tuple(tensor.shape), tensor.__getitem__, dtype)
