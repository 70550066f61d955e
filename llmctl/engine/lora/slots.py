"""Resident LoRA weights on the model's device, and the batched delta each linear adds.

Every adapted linear holds the slots of up to --max-loras adapters (llmctl.plan.lora counts
them): A as [max_loras, slices, max_rank, in] and, per slice, B as [max_loras, max_rank, out]
(transposed), so the first r rows of both are contiguous for an adapter of rank r. A step's
tokens are grouped by slot (LoRAStep), and each group adds (x Aᵀ) B for its adapter: a pair
of small GEMMs per slice and adapter in the step, on whatever device the model runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.engine.lora.adapter import SliceWeights
from llmctl.errors import UnsupportedModelError
from llmctl.model.spec import ModelSpec
from llmctl.plan.lora import LoRATarget, lora_targets

NO_ADAPTER = -1  # a sequence of the base model


@dataclass
class LoRAStep:
    """Which rows of this step's tokens use which slot; the runner sets it before each forward."""

    groups: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)  # (slot, rows); None: all rows

    def set(self, seq_slots: list[int], query_start_loc: list[int], device: torch.device) -> None:
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
    """The slots of one fused linear (QKV, o, gate/up or down) of one decoder layer."""

    def __init__(self, target: LoRATarget, max_loras: int, max_rank: int, dtype: torch.dtype,
                 device: torch.device, step: LoRAStep) -> None:
        slices = len(target.slices)
        self.step = step
        self.a = torch.zeros(max_loras, slices, max_rank, target.in_features, dtype=dtype, device=device)
        self.b = [torch.zeros(max_loras, max_rank, out, dtype=dtype, device=device) for out in target.slice_outs]
        self.columns = [(sum(target.slice_outs[:j]), sum(target.slice_outs[:j + 1])) for j in range(slices)]
        self.ranks = [[0] * slices for _ in range(max_loras)]  # 0: the slot has no weights for that slice

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + sum(b.nbytes for b in self.b)

    def write(self, slot: int, weights: list[SliceWeights | None] | None) -> None:
        """Copy an adapter's weights for this linear into a slot (zeros where it adapts nothing)."""
        for j in range(len(self.b)):
            w = weights[j] if weights is not None else None
            rank = 0 if w is None else w.a.shape[0]
            self.ranks[slot][j] = rank
            if rank:
                self.a[slot, j, :rank].copy_(w.a, non_blocking=True)
                self.b[j][slot, :rank].copy_(w.b.t(), non_blocking=True)

    def add(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + (x Aᵀ) B for every token group of the step, in place."""
        for slot, rows in self.step.groups:
            xs = x if rows is None else x.index_select(0, rows)
            for j, rank in enumerate(self.ranks[slot]):
                if not rank:
                    continue
                delta = F.linear(xs, self.a[slot, j, :rank]) @ self.b[j][slot, :rank]
                start, stop = self.columns[j]
                if rows is None:
                    y[:, start:stop] += delta
                else:
                    y[:, start:stop].index_add_(0, rows, delta)
        return y


def attach_lora_slots(model: nn.Module, spec: ModelSpec, max_loras: int, max_rank: int, dtype: torch.dtype,
                      device: torch.device) -> tuple[LoRAStep, dict[tuple[int, str], LoRASlots]]:
    """Give every adapted linear of the model its slots; they share one LoRAStep."""
    if not getattr(model, "supports_lora", False):
        raise UnsupportedModelError(
            f"LoRA adapters are served on the Llama family (Llama, Mistral, Qwen2, SmolLM2); "
            f"{', '.join(spec.architectures) or spec.model_type} is not supported with --enable-lora yet")
    step = LoRAStep()
    modules = dict(model.named_modules())
    slots: dict[tuple[int, str], LoRASlots] = {}
    for layer in range(spec.num_layers):
        for target in lora_targets(spec):
            linear = modules[f"layers.{layer}.{target.module}"]
            linear.lora = slots[(layer, target.module)] = LoRASlots(target, max_loras, max_rank, dtype, device, step)
    return step, slots
