"""Coded experts (llmctl/engine/layers/coded_experts.py) where some experts arrive as codes and others dequantized
(an act-order GPTQ expert, a GGUF type not kept coded): the layer expects what came, and every expert computes its
MLP with its weights — against the float64 MLP of the dequantized weights (gguf-py's dequantization for the codes)."""

from __future__ import annotations

import pytest
import torch

from helpers.gguf_models import coded_weight, gguf_tensor, reference
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.layers.coded_experts import CodedExperts
from llmctl.kernels import cpu

needs_kernels = pytest.mark.skipif(cpu.unavailable_reason() is not None,
                                   reason=f"C++ kernels not built: {cpu.unavailable_reason()}")
HIDDEN, INTERMEDIATE = 64, 32


def tensor(name: str, value: torch.Tensor) -> CheckpointTensor:
    return CheckpointTensor(name, tuple(value.shape), value.__getitem__, torch.float32)


@needs_kernels
def test_experts_that_came_coded_and_dequantized_load_and_run_as_they_came():
    experts = CodedExperts(range(2), INTERMEDIATE, "gptq")
    dense: dict[tuple[str, int], torch.Tensor] = {}
    for stacked, part, rows, columns in [("w13", 0, INTERMEDIATE, HIDDEN), ("w13", 1, INTERMEDIATE, HIDDEN),
                                         ("w2", 0, HIDDEN, INTERMEDIATE), ("w13", 2, INTERMEDIATE, HIDDEN),
                                         ("w13", 3, INTERMEDIATE, HIDDEN), ("w2", 1, HIDDEN, INTERMEDIATE)]:
        raw = gguf_tensor("Q4_1", rows, columns, seed=part + 10 * len(stacked))
        dense[(stacked, part)] = reference(raw, "Q4_1").view(rows, columns)
        if part in (0, 1) and stacked == "w13" or (stacked, part) == ("w2", 0):  # expert 0: codes
            codes = coded_weight(raw, "Q4_1", rows, columns)
            for field in ("codes", "scales", "offsets"):
                experts.load(f"{stacked}_{field}", tensor(field, getattr(codes, field)), part)
        else:  # expert 1: a dequantized weight
            experts.load(stacked, tensor("weight", dense[(stacked, part)]), part)
    experts.finish_loading()
    assert experts.expected() == {(f"{s}_{f}", p) for s, p in (("w13", 0), ("w13", 1), ("w2", 0))
                                  for f in ("codes", "scales", "offsets")} | {("w13", 2), ("w13", 3), ("w2", 1)}
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(0))
    for expert in (0, 1):
        gate, up = (x.double() @ dense[("w13", 2 * expert + slot)].double().t() for slot in (0, 1))
        expected = (torch.nn.functional.silu(gate) * up) @ dense[("w2", expert)].double().t()
        torch.testing.assert_close(experts.project(expert, x).double(), expected, rtol=1e-4, atol=1e-4)
