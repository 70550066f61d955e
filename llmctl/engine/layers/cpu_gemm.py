"""Linears on CPUs with weights packed once at load, as vLLM's CPU backend does.

torch's plain `F.linear` hands MKL the weight in its checkpoint layout, and MKL reorders it
for every call; at the batch sizes of decoding (a few to a few dozen rows) that reorder
costs as much as the product. Packed layouts skip it:

- float32 on AVX-512 CPUs: llmctl's own panel kernel (kernels/cpu_gemm.cpp). Measured with
  `benchmarks/cpu_gemm.py` on a Zen 4 EPYC over a whole model's weights (read from memory,
  as in decoding), it was 1.15-1.7x faster than oneDNN's packed linear from 1 to 32 rows
  and even to 1.2x faster at prefill sizes, because it keeps the weight stream busy.
- float32 on AVX2/FMA CPUs without AVX-512: the same panels in 8-float registers (6-row tiles of
  one panel), for steps of fewer than AVX2_PANEL_ROWS rows: with every path held to AVX2 on a Xeon
  it was 1.05-1.8x faster than oneDNN and plain F.linear from 1 to 32 rows, even at 40, and behind
  from 48 (0.8x at 256), where plain F.linear runs instead.
- bfloat16 on CPUs with AMX: the same panels, whose bfloat16 form is AMX's tile layout, run on
  AMX tiles (kernels/cpu_gemm.cpp); on a Sapphire Rapids Xeon 1.3-3x faster than oneDNN's
  packed linear from 1 to 32 rows, even at prefill sizes.
- bfloat16 on CPUs with AVX512-BF16 but no AMX (Zen 4): the same panels with vdpbf16ps dot
  products; with both sides held to AVX512-BF16 on the Xeon, 1.2-1.7x faster than oneDNN from 1 to
  64 rows, even at 256. LLMCTL_AMX=0 takes this path on an AMX CPU too.
- otherwise (CPUs without AVX2/FMA or AVX512-BF16, or no C++ compiler): oneDNN's prepacked layout
  (`torch.ops.mkldnn`), 1.3-2.2x faster than plain for gate/up and the LM head from 4 to 64
  rows, 1.0-1.8x for the smaller ones, about even at prefill sizes.

Whether packing also wins for one to three rows depends on the CPU: on a Xeon (Sapphire
Rapids) oneDNN's per-call setup cost more than it saved below 4 rows, on a Zen 4 EPYC
packing wins 1.5-2.5x from a single row. So the crossover is measured once at load
(`measure_small_batch`) and steps below it keep the plain weight — which is why the packed
copy is added, not swapped in, and only when the host has the memory for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.errors import SettingError
from llmctl.kernels import cpu as cpu_kernels
from llmctl.kernels.huge_pages import zeros_on_huge_pages

logger = logging.getLogger("llmctl")

MAX_SMALL_BATCH = 4  # from 4 rows on, packing won on every CPU measured
PACKABLE = (torch.float32, torch.bfloat16)
AVX2_PANEL_ROWS = 40  # steps of this many rows or more run plain F.linear, not the AVX2 panels (see above)
PANEL_ISA_ENV = "LLMCTL_PANEL_ISA"  # auto (the widest built), avx512, avx2 or off: float32 panels' path
AMX_ENV = "LLMCTL_AMX"  # 0: bfloat16 panels with AVX512-BF16 dot products even where the CPU has AMX


@dataclass(frozen=True)
class PackedWeight:
    """A [N, K] CPU weight packed once: llmctl's panels (float32 on `isa`, or bfloat16) or oneDNN's layout;
    steps of `max_rows` rows or more run the plain weight (0: no limit)."""

    data: torch.Tensor
    out_features: int
    panels: bool
    isa: str = "auto"
    max_rows: int = 0
    amx: bool = True  # bfloat16: on AMX tiles where the CPU has them
    min_rows: int = 0  # steps of fewer rows run the plain weight (0: the model's crossover, small_batch())

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.panels:
            return cpu_kernels.panel_linear(x, self.data, self.out_features, bias, use_amx=self.amx, isa=self.isa)
        return torch.ops.mkldnn._linear_pointwise(x, self.data, bias, "none", [], "")


def float32_panel_isa() -> str | None:
    """The path float32 panels take here: LLMCTL_PANEL_ISA if set (refused when not built), else the
    widest built (avx512, then avx2); None where there is none or the variable says off."""
    built = cpu_kernels.panel_isas()
    wanted = os.environ.get(PANEL_ISA_ENV, "auto")
    if wanted == "off":
        return None
    if wanted != "auto" and wanted not in built:
        raise SettingError(f"{PANEL_ISA_ENV}={wanted}: this machine's float32 panel paths are "
                         f"{', '.join(built) or 'none'} (or use auto, off)")
    return built[0] if wanted == "auto" and built else (wanted if wanted != "auto" else None)


def _takes_panels(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if weight.dtype == torch.bfloat16:
        if _bf16_on_amx():
            return weight.shape[1] % 32 == 0
        return weight.shape[1] % 2 == 0 and cpu_kernels.bf16_panels_supported()
    return weight.dtype == torch.float32 and float32_panel_isa() is not None


def _bf16_on_amx() -> bool:
    return cpu_kernels.bf16_amx_supported() and os.environ.get(AMX_ENV, "1") != "0"


def _panel_elements(weight: torch.Tensor) -> int:
    """Elements of pack_panels(weight): [2 · ⌈N / 32⌉, K, 16]."""
    return 2 * -(-weight.shape[0] // 32) * weight.shape[1] * 16


class PanelArena:
    """One buffer on 2 MiB pages that a model's panels (of its one dtype) are packed into, one after
    another: decoding streams all of them every step, and on 4 KiB pages that cost a page-table walk
    every 4 KiB (benchmarks/cpu_gemm.py measures both)."""

    def __init__(self, weights: list[torch.Tensor]) -> None:
        panelled = [w for w in weights if _takes_panels(w)]
        self.dtype = panelled[0].dtype if panelled else torch.float32
        total = sum(_panel_elements(w) for w in panelled if w.dtype == self.dtype)
        self.buffer = zeros_on_huge_pages((total,), self.dtype, populate=False)  # packing writes it all
        self.used = 0

    def place(self, panels: torch.Tensor) -> torch.Tensor:
        if panels.dtype != self.dtype:
            return panels
        view = self.buffer[self.used:self.used + panels.numel()].view(panels.shape)
        view.copy_(panels)
        self.used += panels.numel()
        return view


def pack_weight(weight: torch.Tensor, arena: PanelArena | None = None) -> PackedWeight | None:
    """The packed copy of a [N, K] CPU weight (float32 panels into `arena` when given), or None
    where neither kernel can take it."""
    if weight.device.type != "cpu" or weight.dtype not in PACKABLE:
        return None
    if _takes_panels(weight):
        panels = cpu_kernels.pack_panels(weight)
        isa = float32_panel_isa() if weight.dtype == torch.float32 else "auto"
        return PackedWeight(arena.place(panels) if arena is not None else panels, weight.shape[0], panels=True,
                            isa=isa, max_rows=AVX2_PANEL_ROWS if isa == "avx2" else 0, amx=_bf16_on_amx())
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return PackedWeight(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None), weight.shape[0], panels=False)
    except RuntimeError:
        return None


def kernel_name(packed: PackedWeight) -> str:
    """What runs a packed weight, for the startup log."""
    if not packed.panels:
        return "oneDNN's CPU GEMMs"
    if packed.data.dtype == torch.bfloat16:
        return "llmctl's AMX bfloat16 GEMM" if packed.amx else "llmctl's AVX512-BF16 bfloat16 GEMM"
    if packed.isa == "avx2":
        return f"llmctl's AVX2 float32 GEMM (steps under {packed.max_rows} rows; plain F.linear from there)"
    return "llmctl's AVX-512 float32 GEMM"


_small_batch = MAX_SMALL_BATCH  # rows below which the plain weight runs; set by pack_linears
_head_small_batch = 0  # the same for the LM head, measured on it (0: not packed)
NOTHING_PACKED = "torch's own linears (no packed copies)"
_packed_kernel = NOTHING_PACKED  # kernel_name of the packed weights; set by pack_linears


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


def head_small_batch() -> int:
    """Rows below which the LM head runs its plain weight (measured on it by the last pack_linears; 0: none)."""
    return _head_small_batch


def packed_kernel() -> str:
    """What runs the packed weights of the last pack_linears, for the startup log."""
    return _packed_kernel


_measured: dict[tuple, int] = {}  # crossovers this process measured, by weight shape and kernel


def measure_small_batch(weight: torch.Tensor, packed: PackedWeight) -> int:
    """The fewest rows from which the packed weight is faster than the plain one on this CPU
    (1 to MAX_SMALL_BATCH), timed on one weight with a few calls (a few ms). Measured once per process for
    each shape and kernel: engines built in one process (replicas, a test's two) then choose the same kernel
    for the same rows, so their numbers agree bit for bit however busy the machine was at each start."""
    key = (tuple(weight.shape), weight.dtype, packed.panels, packed.isa, packed.amx, torch.get_num_threads())
    if key not in _measured:
        _measured[key] = _crossover(weight, packed)
    return _measured[key]


def _crossover(weight: torch.Tensor, packed: PackedWeight) -> int:
    for rows in range(1, MAX_SMALL_BATCH):
        x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
        plain = _fastest_seconds(lambda: F.linear(x, weight))  # noqa: B023 (timed before x changes)
        ours = _fastest_seconds(lambda: packed.linear(x, None))  # noqa: B023 (timed before x changes)
        if ours < plain:
            return rows
    return MAX_SMALL_BATCH


def linear(x: torch.Tensor, weight: torch.Tensor, packed: PackedWeight | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b, through the packed weight when there is one and the batch is large enough."""
    if packed is None or x.dim() != 2 or x.shape[0] < (packed.min_rows or _small_batch) or x.dtype != weight.dtype or \
            0 < packed.max_rows <= x.shape[0]:
        return F.linear(x, weight, bias)
    return packed.linear(x, bias)


class PackedLinear(nn.Module):
    """An nn.Linear whose weight also has a packed copy (same parameters, same state dict)."""

    def __init__(self, plain: nn.Linear, packed: PackedWeight) -> None:
        super().__init__()
        self.weight, self.bias = plain.weight, plain.bias
        self.packed = packed  # an attribute, not a buffer: the state dict stays transformers's

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.packed, self.bias)


def packed_weights(model: nn.Module) -> list[tuple[torch.Tensor, PackedWeight]]:
    """Every (weight, its packed copy) pack_linears made: the linears', the LM head's, the routed experts'."""
    pairs: list[tuple[torch.Tensor, PackedWeight | None]] = []
    for module in model.modules():
        if isinstance(module, PackedLinear):
            pairs.append((module.weight, module.packed))
        if getattr(module, "packed_head", None) is not None:
            pairs.append((module.weight, module.packed_head))
        if getattr(module, "packed_experts", None):
            pairs += zip(module.expert_weights(), [p for pair in module.packed_experts for p in pair])
    return [(weight, packed) for weight, packed in pairs if packed is not None]


def repack_panels(model: nn.Module) -> None:
    """llmctl's panel copies made again, in place, from weights read again (sleep level 2's waking; oneDNN's
    copies are not released, llmctl.engine.worker.sleep)."""
    for weight, packed in packed_weights(model):
        if not packed.panels:
            continue
        fresh = pack_weight(weight)
        assert fresh is not None and fresh.data.shape == packed.data.shape
        packed.data.copy_(fresh.data)


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def pack_linears(model: nn.Module) -> int:
    """Give every plain linear of a CPU model, the LM head and each routed expert's two weights a packed copy,
    and repack 4-bit GPTQ/AWQ linears for the int4 kernel (logged apart); returns the bytes of the float copies.
    Skipped, with a log line, when the copies would take more than half the free memory."""
    global _small_batch, _head_small_batch, _packed_kernel
    _small_batch, _head_small_batch, _packed_kernel = MAX_SMALL_BATCH, 0, NOTHING_PACKED  # this model's
    linears = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) is nn.Linear]
    heads = [m for m in model.modules() if hasattr(m, "packed_head") and getattr(m, "coded", None) is None]
    experts = [m for m in model.modules() if hasattr(m, "packed_experts")]  # layers.moe.FusedMoE
    expert_weights = [w for m in experts for w in m.expert_weights()]
    total = sum(w.numel() * w.element_size() for w in [c.weight for _, _, c in linears] + expert_weights) + \
        sum(h.weight.numel() * h.weight.element_size() for h in heads)
    available = _available_memory()
    if available is not None and total > available // 2:
        logger.info("linears not packed: the copies (%.2f GiB) would take over half the free memory",
                    total / 2**30)
        return 0
    added = 0
    largest: PackedLinear | None = None
    arena = PanelArena([c.weight for _, _, c in linears] + [h.weight for h in heads] + expert_weights)
    for parent, name, child in linears:
        packed = pack_weight(child.weight, arena)
        if packed is not None:
            packed_linear = PackedLinear(child, packed)
            setattr(parent, name, packed_linear)
            added += child.weight.numel() * child.weight.element_size()
            if largest is None or child.weight.numel() > largest.weight.numel():
                largest = packed_linear
    for head in heads:
        head.packed_head = _with_own_crossover(head.weight, pack_weight(head.weight, arena))
        _head_small_batch = head.packed_head.min_rows if head.packed_head is not None else _head_small_batch
        added += head.weight.numel() * head.weight.element_size() if head.packed_head is not None else 0
    _repack_4bit(model)
    for moe in experts:
        packs = [pack_weight(w, arena) for w in moe.expert_weights()]
        moe.packed_experts = list(zip(packs[0::2], packs[1::2]))
        added += sum(w.numel() * w.element_size() for w, p in zip(moe.expert_weights(), packs) if p is not None)
    if largest is not None:
        _small_batch = measure_small_batch(largest.weight.detach(), largest.packed)
        _packed_kernel = kernel_name(largest.packed)
    return added


def _with_own_crossover(weight: torch.Tensor, packed: PackedWeight | None) -> PackedWeight | None:
    """An LM head's packed copy with its own crossover: the vocabulary makes it the largest weight by far, a
    stream of bytes where the panels' threads win from one row even when a small model's other linears are
    too small to (a 64-wide Llama's 49,152-row head: 0.09 ms against plain F.linear's 0.28 on a Zen 4)."""
    if packed is None:
        return None
    return dataclasses.replace(packed, min_rows=measure_small_batch(weight.detach(), packed))


def _repack_4bit(model: nn.Module) -> None:
    """GPTQ/AWQ linears (QuantLinear) repacked for the C++ int4 kernel, which reads them without a float copy."""
    layers = [m for m in model.modules() if hasattr(m, "pack_for_cpu")]
    added = [layer.pack_for_cpu() for layer in layers]
    taken = sum(1 for size in added if size)
    if taken:
        logger.info("%d of %d 4-bit linears repacked for llmctl's int4 CPU kernel (%s path, %.2f GiB; the rest "
                    "dequantize in torch at each step)", taken, len(layers), cpu_kernels.int4_isas()[0],
                    sum(added) / 2**30)
