"""Kernel launches per decoder layer on the CUDA path, counted without a GPU: the model is built on fake CUDA
tensors (helpers/fake_cuda.py) and one decode step's layer is traced op by op. Every op that is not a view or a
metadata query is a launch. The step's shared work — cos/sin per rotary, the
attention layout — runs once per step at its first layer, so each layer is counted on a second pass.

Counted for a batch of 4 decodes, where the attention splits the context and merges it (two launches)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.fake_cuda import BATCH, FAMILIES, fake_cuda_step, prepare

NOT_LAUNCHES = {"prim.device.default", "aten.sym_size.int", "aten.sym_stride.int", "aten.sym_numel.default"}


class Launches(TorchDispatchMode):
    """The ops that launch a kernel, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        if not func.is_view and name not in NOT_LAUNCHES:
            split = name == "llmctl.paged_attention.default" and args[9] > 1  # + the merge of the segments
            self.ops += [name, "llmctl merge (in paged_attention)"] if split else [name]
        return func(*args, **(kwargs or {}))


def traced_layers(config) -> list[list[str]]:
    """The launches of each decoder layer of `config`'s model in one decode step, bfloat16, on fake CUDA."""
    step = fake_cuda_step(config)
    with step.mode, torch.no_grad():
        prepare(step)
        x = torch.empty(BATCH, step.spec.hidden_size, dtype=torch.bfloat16, device=torch.device("cuda"))
        for index, layer in enumerate(step.model.layers):  # the step's shared work, done by its first layers
            layer(x, step.ctx, index)
        counted = []
        for index, layer in enumerate(step.model.layers):
            with Launches() as launches:
                layer(x, step.ctx, index)
            counted.append(launches.ops)
    return counted


@pytest.mark.parametrize("family,limit", [("llama", 12), ("qwen3", 16), ("gemma3", 15)])
def test_a_decode_layer_launches_at_most(family, limit):
    """The issue's bar: ≤ 12 launches for a Llama layer, ≤ 16 with QK-norm (Qwen3) or Gemma 3's four norms (whose
    pre-MLP norm takes the residual add: 15)."""
    for ops in traced_layers(FAMILIES[family]()):
        print(f"{family}: {len(ops)} launches: {', '.join(ops)}")
        assert len(ops) <= limit, ops
        assert sum(op.startswith("llmctl.rms_norm") for op in ops) == {"llama": 2, "qwen3": 4, "gemma3": 6}[family]
        assert ops.count("aten.add.Tensor") == 1  # the other residual add is fused into a norm
        assert "llmctl.rotary_store.default" in ops and "aten.clone.default" not in ops  # no .contiguous() copy
