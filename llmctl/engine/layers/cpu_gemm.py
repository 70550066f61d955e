"""Linears on CPUs through oneDNN with weights packed once at load, as vLLM's CPU backend does.

torch's plain `F.linear` hands MKL the weight in its checkpoint layout, and MKL reorders it
for every call; at the batch sizes of decoding (a few to a few dozen rows) that reorder
costs as much as the product. oneDNN's prepacked layout (`torch.ops.mkldnn`) skips it:
measured with `benchmarks/cpu_gemm.py` on SmolLM2's shapes, 1.3-2.2x faster for gate/up and
the LM head from 4 to 64 rows, 1.0-1.8x for the smaller ones, about even at prefill sizes
(256-2048 rows). Below `SMALL_BATCH` rows (one or two sequences decoding) oneDNN's per-call setup
costs more than it saves, so those steps keep the plain weight — which is why the packed
copy is added, not swapped in, and only when the host has the memory for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("llmctl")

SMALL_BATCH = 4  # rows below which the plain weight is faster
PACKABLE = (torch.float32, torch.bfloat16)


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed copy of a [N, K] CPU weight, or None where oneDNN cannot take it."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except RuntimeError:
        return None


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b, through the packed weight when there is one and the batch is large enough."""
    if packed is None or x.dim() != 2 or x.shape[0] < SMALL_BATCH or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An nn.Linear whose weight also has a oneDNN-packed copy (same parameters, same state dict)."""

    def __init__(self, plain: nn.Linear, packed: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.bias = plain.weight, plain.bias
        self.packed = packed  # an opaque mkldnn tensor: an attribute, not a buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.packed, self.bias)


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pack_linears(model: nn.Module) -> int:
    """Give every plain linear of a CPU model (and the LM head) a packed copy; returns the bytes added.
    Skipped, with a log line, when the copies would take more than half the free memory."""
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    heads = [m for m in model.modules() if hasattr(m, "packed_head")]
    total = sum(c.weight.numel() * c.weight.element_size() for _, _, c in linears) + \
        sum(h.weight.numel() * h.weight.element_size() for h in heads)
    available = _available_memory()
    if available is not None and total > available // 2:
        logger.info("linears not packed for oneDNN: the copies (%.2f GiB) would take over half the free memory",
                    total / 2**30)
        return 0
    added = 0
    for parent, name, child in linears:
        packed = pack_weight(child.weight)
        if packed is not None:
            setattr(parent, name, PackedLinear(child, packed))
            added += child.weight.numel() * child.weight.element_size()
    for head in heads:
        head.packed_head = pack_weight(head.weight)
        added += head.weight.numel() * head.weight.element_size() if head.packed_head is not None else 0
    return added
