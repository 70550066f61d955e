"""Linears on CPUs through oneDNN with weights packed once at load, as vLLM's CPU backend does.

torch's plain `F.linear` hands MKL the weight in its checkpoint layout, and MKL reorders it
for every call; at the batch sizes of decoding (a few to a few dozen rows) that reorder
costs as much as the product. oneDNN's prepacked layout (`torch.ops.mkldnn`) skips it:
measured with `benchmarks/cpu_gemm.py` on SmolLM2's shapes, 1.3-2.2x faster for gate/up and
the LM head from 4 to 64 rows, 1.0-1.8x for the smaller ones, about even at prefill sizes
(256-2048 rows). Whether it also wins for one to three rows depends on the CPU: on a Xeon
(Sapphire Rapids) oneDNN's per-call setup cost more than it saved below 4 rows, on a Zen 4 EPYC
packing wins 1.5-2.5x from a single row. So the crossover is measured once at load
(`measure_small_batch`) and steps below it keep the plain weight — which is why the packed
copy is added, not swapped in, and only when the host has the memory for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger("llmctl")

MAX_SMALL_BATCH = 4  # from 4 rows on, packing won on every CPU measured
PACKABLE = (torch.float32, torch.bfloat16)


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed copy of a [N, K] CPU weight, or None where oneDNN cannot take it."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except RuntimeError:
        return None


_small_batch = MAX_SMALL_BATCH  # rows below which the plain weight runs; set by pack_linears


def _fastest_seconds(call: Callable[[], object], calls: int = 7) -> float:
    call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)  # the least disturbed call: two noisy cores make means useless


def small_batch() -> int:
    """Rows below which the plain weight runs (measured by the last pack_linears)."""
    return _small_batch


def measure_small_batch(weight: torch.Tensor, packed: torch.Tensor) -> int:
    """The fewest rows from which the packed weight is faster than the plain one on this CPU
    (1 to MAX_SMALL_BATCH), timed on one weight with a few calls (a few ms)."""
    for rows in range(1, MAX_SMALL_BATCH):
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
        plain = _fastest_seconds(lambda: F.linear(x, weight))
        ours = _fastest_seconds(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        if ours < plain:
            return rows
    return MAX_SMALL_BATCH


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b, through the packed weight when there is one and the batch is large enough."""
    if packed is None or x.dim() != 2 or x.shape[0] < _small_batch or x.dtype != weight.dtype:
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
    global _small_batch
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
    largest: PackedLinear | None = None
    for parent, name, child in linears:
        packed = pack_weight(child.weight)
        if packed is not None:
            packed_linear = PackedLinear(child, packed)
            setattr(parent, name, packed_linear)
            added += child.weight.numel() * child.weight.element_size()
            if largest is None or child.weight.numel() > largest.weight.numel():
                largest = packed_linear
    for head in heads:
        head.packed_head = pack_weight(head.weight)
        added += head.weight.numel() * head.weight.element_size() if head.packed_head is not None else 0
    if largest is not None:
        _small_batch = measure_small_batch(largest.weight.detach(), largest.packed)
    return added
