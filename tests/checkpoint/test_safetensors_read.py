"""llmctl's pread reader of safetensors files against the safetensors library's own reads (the reference)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from llmctl.checkpoint import safetensors_read
from llmctl.checkpoint.safetensors_read import stored_tensors
from llmctl.errors import CorruptModelError

TENSORS = {
    "a.weight": torch.randn(7, 5, 3),
    "b.bias": torch.randn(4).to(torch.bfloat16),
    "c.codes": torch.randint(0, 255, (9, 6), dtype=torch.uint8),
    "d.scalar": torch.tensor(3.5, dtype=torch.float16),
    "e.fp8": torch.randn(3, 4).to(torch.float8_e4m3fn),
    "f.empty": torch.empty(0, 4),
    "g.ids": torch.arange(10, dtype=torch.int64).reshape(2, 5),
}
SLICES = [(slice(1, 3),), (slice(None), slice(1, 3)), (slice(2, 6), slice(0, 2), slice(1, 2)), (slice(5, 2),)]


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file(TENSORS, str(path), metadata={"format": "pt"})
    return path


def test_every_tensor_and_slice_reads_as_the_safetensors_library_reads_it(stored, monkeypatch):
    monkeypatch.setattr(safetensors_read, "CHUNK_BYTES", 16)  # slices along dim 1 read in several chunks
    ours = stored_tensors(stored)
    with safe_open(str(stored), framework="pt") as handle:
        assert list(ours) == list(handle.keys())
        for name, tensor in ours.items():
            part = handle.get_slice(name)
            assert tensor.shape == tuple(part.get_shape())
            indices = [tuple(slice(None) for _ in tensor.shape)] + [s[:len(tensor.shape)] for s in SLICES
                                                                     if len(s) <= len(tensor.shape)]
            for index in indices:
                mine, theirs = tensor(index), part[index]
                assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, (name, index)
                assert torch.equal(_bytes(mine), _bytes(theirs)), (name, index)


def test_a_truncated_file_is_refused_with_what_to_do(stored, tmp_path):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(stored.read_bytes()[:-40])
    with pytest.raises(CorruptModelError, match="re-download"):
        stored_tensors(cut)
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CorruptModelError, match="header is not JSON"):
        stored_tensors(tmp_path / "junk.safetensors")


def test_an_unknown_dtype_leaves_the_file_to_the_safetensors_library(tmp_path):
    import json
    import struct

    header = json.dumps({"x": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}).encode()
    path = tmp_path / "f4.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00")
    assert stored_tensors(path) is None
