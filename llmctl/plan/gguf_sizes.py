"""A GGUF model's weight bytes as vLLM holds them on a GPU: each tensor stays in its GGUF blocks (vLLM's
GGUF linear and embedding methods), so a layer costs its blocks' bits per weight, scales included."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TABLES = ("token_embd.weight", "output.weight")  # the embedding table and an untied LM head


@dataclass(frozen=True)
class GgufSizes:
    linear_bits: float  # bits per weight of the decoder layers' matrices (attention, MLP, experts)
    table_bits: float  # of the embedding table and an untied LM head
    types: tuple[str, ...]  # the quantized types of those tensors, most weights first


def gguf_sizes(path: Path) -> GgufSizes:
    """Read from the file's header: every matrix's elements and bytes (no tensor is loaded)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    matrices = [t for t in reader.tensors if len(t.shape) >= 2 or t.name in TABLES]  # not norms and biases
    layers = [t for t in matrices if t.name.startswith("blk.")]
    tables = [t for t in matrices if t.name in TABLES]
    by_type: dict[str, int] = {}
    for tensor in matrices:
        by_type[tensor.tensor_type.name] = by_type.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
    return GgufSizes(_bits(layers), _bits(tables), tuple(sorted(by_type, key=lambda name: -by_type[name])))


def _bits(tensors: list) -> float:
    elements = sum(int(t.n_elements) for t in tensors)
    return 8 * sum(int(t.n_bytes) for t in tensors) / elements if elements else 0.0
