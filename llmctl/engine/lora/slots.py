"""Resident LoRA weights on the model's device, and the batched delta each linear adds.

Every adapted linear holds the slots of up to --max-loras adapters (llmctl.sizing.lora counts
them). A step's tokens are grouped by slot (LoRAStep), and each group adds (x Aᵀ) B for its
adapter: two small GEMMs per linear and adapter in the step (plus a gather and a scatter when
the step mixes adapters), on whatever device the model runs. A CUDA graph cannot hold that
host-side grouping, so a captured step reads a static one-hot [tokens, slots] instead: one
GEMM through every slot's A, the other slots' columns zeroed, one GEMM through every B
(llmctl.engine.worker.cuda_graphs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.lora.adapter import SliceWeights
from llmctl.errors import UnsupportedModelError
from llmctl.sizing.lora import LoRATarget, lora_targets

NO_ADAPTER = -1  # a sequence of the base model


@dataclass
class LoRAStep:
    """Which rows of this step's tokens use which slot; the runner sets it before each forward."""

    groups: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)  # (slot, rows); None: all rows
    one_hot: torch.Tensor | None = None  # [T, max_loras] a captured step's slots (1 where a token uses a slot)

    def use_static(self, one_hot: torch.Tensor) -> None:
        """Read the step's slots from this buffer (a CUDA graph's) until the next set()."""
        self.groups, self.one_hot = [], one_hot

    def set(self, seq_slots: list[int], query_start_loc: list[int], device: torch.device) -> None:
        self.one_hot = None
        used = {slot for slot in seq_slots if slot != NO_ADAPTER}
        if not used:
            self.groups = []
            return
        if len(used) == 1 and NO_ADAPTER not in seq_slots:
            self.groups = [(used.pop(), None)]
            return
        rows: dict[int, list[int]] = {}
        for index, slot in enumerate(seq_slots):
            if slot != NO_ADAPTER:
                rows.setdefault(slot, []).extend(range(query_start_loc[index], query_start_loc[index + 1]))
        self.groups = [(slot, torch.tensor(r, dtype=torch.long, device=device)) for slot, r in rows.items()]


class LoRASlots:
    """The slots of one fused linear (QKV, o, gate/up or down) of one decoder layer.

    An adapter's slices sit packed in a slot: slice j's r_j rows of A follow slice j-1's, and B
    holds the same rows with slice j's output columns filled (zeros elsewhere). So the first
    n = Σ r_j rows of A [n, in] and B [n, out] are contiguous, and an adapter's delta over all
    the slices it adapts is two GEMMs: (x Aᵀ) B."""

    def __init__(self, target: LoRATarget, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device, step: LoRAStep) -> None:
        rows = len(target.slices) * max_rank
        self.step = step
        self.a = torch.zeros(max_loras, rows, target.in_features, dtype=dtype, device=device)
        self.b = torch.zeros(max_loras, rows, sum(target.slice_outs), dtype=dtype, device=device)
        self.columns = [(sum(target.slice_outs[:j]), sum(target.slice_outs[:j + 1]))
                        for j in range(len(target.slices))]
        self.packed_rank = [0] * max_loras  # rows in use per slot (0: the adapter leaves this linear alone)

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.b.nbytes

    def write(self, slot: int, weights: list[SliceWeights | None] | None) -> None:
        """Copy an adapter's weights for this linear into a slot, packed; zeros for the rest."""
        self.a[slot].zero_()
        self.b[slot].zero_()
        row = 0
        for (start, stop), w in zip(self.columns, weights or [None] * len(self.columns)):
            if w is None:
                continue
            rank = w.a.shape[0]
            self.a[slot, row:row + rank].copy_(w.a, non_blocking=True)
            self.b[slot, row:row + rank, start:stop].copy_(w.b.t(), non_blocking=True)
            row += rank
        self.packed_rank[slot] = row

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + (x Aᵀ) B for every token group of the step, in place."""
        if self.step.one_hot is not None:
            return self._add_static(x, y, self.step.one_hot)
        for slot, rows in self.step.groups:
            n = self.packed_rank[slot]
            if not n:
                continue
            a, b = self.a[slot, :n], self.b[slot, :n]
            if rows is None:
                y.addmm_(F.linear(x, a), b)
            else:
                y.index_add_(0, rows, F.linear(x.index_select(0, rows), a) @ b)
        return y

    def _add_static(self, x: torch.Tensor, y: torch.Tensor, one_hot: torch.Tensor) -> torch.Tensor:
        """add() without host-side groups: every slot's full rank (unused rows are zeros), masked per token."""
        slots, rank = self.a.shape[0], self.a.shape[1]
        shrunk = F.linear(x, self.a.view(slots * rank, -1)).view(-1, slots, rank)
        masked = (shrunk * one_hot.to(shrunk.dtype).unsqueeze(-1)).view(-1, slots * rank)
        return y.addmm_(masked, self.b.view(slots * rank, -1))


def attach_lora_slots(model: nn.Module, spec: ModelSpec, max_loras: int, max_rank: int, dtype: torch.dtype,
                      device: torch.device) -> tuple[LoRAStep, dict[tuple[int, str], LoRASlots]]:
    """Give every adapted linear of the model its slots; they share one LoRAStep."""
    if not getattr(model, "supports_lora", False):
        raise UnsupportedModelError(
            f"LoRA adapters are served on the Llama family (Llama, Mistral, Qwen2, Qwen3, Granite, OLMo 2, SmolLM2); "
            f"{', '.join(spec.architectures) or spec.model_type} is not supported with --enable-lora yet")
    step = LoRAStep()
    modules = dict(model.named_modules())
    slots: dict[tuple[int, str], LoRASlots] = {}
    for layer in range(spec.num_layers):
        for target in lora_targets(spec):
            linear = modules[f"layers.{layer}.{target.module}"]
            linear.lora = slots[(layer, target.module)] = LoRASlots(target, max_loras, max_rank, dtype, device, step)
    return step, slots
