"""Safetensors tensors read with pread into memory this process owns, never through a memory map.

The `safetensors` library maps the whole file and copies a tensor out of the map; every page it read stays in
this process's resident memory until the file is closed, so a load peaks at the checkpoint's size on top of
the weights it builds (100 MiB more for the default model's coded GGUF conversion). Read with pread, the
file's pages live in the kernel's page cache only, which is not this process's memory.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and [begin, end) byte offsets after the header, then the data, row-major
and little-endian. A tensor read whole or along its first dimension is one pread; a slice along another
dimension reads its rows in chunks of at most `CHUNK_BYTES` and keeps the slice of each.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from llmctl.errors import CorruptModelError

CHUNK_BYTES = 64 << 20
MAX_HEADER_BYTES = 100 << 20  # the safetensors library's own limit
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu}


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in its file."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offset of its first byte

    def __call__(self, index: tuple[slice, ...]) -> torch.Tensor:
        """tensor[index] for plain slices (step 1), as a tensor of its own."""
        if not self.shape:
            return self._rows(0, 1).reshape(())
        first, rest = index[0] if index else slice(None), tuple(index[1:])
        start, stop, _ = first.indices(self.shape[0])
        stop = max(stop, start)
        if all(s == slice(None) for s in rest):
            return self._rows(start, stop)
        step = max(1, CHUNK_BYTES // max(1, self._row_bytes()))
        parts = [self._rows(a, min(a + step, stop))[(slice(None), *rest)].clone() for a in range(start, stop, step)]
        return torch.cat(parts) if parts else self._rows(start, start)[(slice(None), *rest)]

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty(0, dtype=self.dtype).element_size()

    def _row_bytes(self) -> int:
        return torch.Size(self.shape[1:]).numel() * torch.empty(0, dtype=self.dtype).element_size()

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        row_bytes = self._row_bytes()
        raw = torch.empty((stop - start) * row_bytes, dtype=torch.uint8)
        _read_exactly(self.path, raw, self.begin + start * row_bytes)
        return raw.view(self.dtype).view(stop - start, *self.shape[1:])


def _read_exactly(path: Path, into: torch.Tensor, offset: int) -> None:
    view, done = into.numpy().data, 0  # a memoryview of the tensor's own bytes
    with open(path, "rb", buffering=0) as handle:
        while done < len(view):
            got = os.preadv(handle.fileno(), [view[done:]], offset + done)
            if got <= 0:
                raise CorruptModelError(f"{path} ends before its tensors do: re-download the file")
            done += got


def stored_tensors(path: Path) -> dict[str, StoredTensor] | None:
    """Every tensor of one safetensors file, from its header; None when a dtype is one this reader does not
    know (the caller reads that file with the safetensors library)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= MAX_HEADER_BYTES:
            raise CorruptModelError(f"{path} is not a readable safetensors file (header length {length})")
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise CorruptModelError(f"{path} is not a readable safetensors file: its header is not JSON "
                                    f"({exc})") from None
    header.pop("__metadata__", None)
    data_bytes = path.stat().st_size - 8 - length
    tensors: dict[str, StoredTensor] = {}
    for name in sorted(header):  # the safetensors library's order
        info = header[name]
        if info.get("dtype") not in DTYPES:
            return None
        tensor = StoredTensor(path, DTYPES[info["dtype"]], tuple(info["shape"]), 8 + length + info["data_offsets"][0])
        begin, end = info["data_offsets"]
        if end - begin != tensor.nbytes or end > data_bytes:
            raise CorruptModelError(f"{path}: tensor {name} does not fit its offsets {begin}-{end} (file truncated "
                                    "or corrupt): re-download the file")
        tensors[name] = tensor
    return tensors
