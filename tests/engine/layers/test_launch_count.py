"""Kernel launches per decoder layer on the CUDA path, counted without a GPU: the model is built on fake CUDA
tensors (torch's FakeTensorMode; the Triton launches are registered ops with fake implementations,
`llmctl.engine.layers.fused_ops` and `attention_ops`) and one decode step's layer is traced op by op. Every
op that is not a view or a metadata query is a launch. The step's shared work — cos/sin per rotary, the
attention layout — runs once per step at its first layer, so each layer is counted on a second pass.

Counted for a batch of 4 decodes, where the attention splits the context and merges it (two launches)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

BATCH, BLOCK_SIZE, BLOCKS = 4, 16, 8
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
    from llmctl.checkpoint.spec import build_spec
    from llmctl.engine.layers.attention import KVCache
    from llmctl.engine.layers.triton_attention import StepTensors, TritonAttention
    from llmctl.engine.models.common import StepContext
    from llmctl.engine.models.registry import create_model
    from llmctl.kernels.attention import plan_step

    spec = build_spec(config.to_dict())
    with torch.device("meta"):
        model = create_model(spec, config, impl="llmctl")
    mode = FakeTensorMode()

    def on_fake_gpu(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        meta = tensor.to("meta", dtype=dtype or tensor.dtype)
        return FakeTensor(mode, meta, torch.device("cuda"))

    model._apply(lambda t: on_fake_gpu(t, torch.bfloat16 if t.is_floating_point() and t.dim() > 0
                                       and t.dtype != torch.float32 or isinstance(t, torch.nn.Parameter) else None))
    att = spec.attention
    planned = plan_step(list(range(BATCH + 1)), att.num_heads, att.num_kv_heads, torch.device("cpu"))
    layout = dataclasses.replace(planned, **{name: on_fake_gpu(getattr(planned, name))
                                             for name in ("query_start_loc", "block_seq", "block_first")})
    with mode, torch.no_grad():
        cuda = torch.device("cuda")
        backend = TritonAttention()
        backend.use_static(StepTensors(
            slot_mapping=torch.arange(BATCH, device=cuda, dtype=torch.int64) * BLOCK_SIZE,
            block_tables=torch.zeros(BATCH, 2, dtype=torch.int32, device=cuda),
            seq_lens=torch.full((BATCH,), 20, dtype=torch.int32, device=cuda),
            layout=layout,
            query_start_loc=list(range(BATCH + 1)), sliding_window=None))
        caches = {i: KVCache(torch.empty(BLOCKS, BLOCK_SIZE, 2, att.num_kv_heads, att.head_dim,
                                         dtype=torch.bfloat16, device=cuda)) for i in range(spec.num_layers)}
        ctx = StepContext(torch.full((BATCH,), 19, dtype=torch.int64, device=cuda), caches, backend)
        x = torch.empty(BATCH, spec.hidden_size, dtype=torch.bfloat16, device=cuda)
        for index, layer in enumerate(model.layers):  # the step's shared work, done by its first layers
            layer(x, ctx, index)
        counted = []
        for index, layer in enumerate(model.layers):
            with Launches() as launches:
                layer(x, ctx, index)
            counted.append(launches.ops)
    return counted


def llama():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"])


def qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, architectures=["Qwen3ForCausalLM"])


def gemma3():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"], architectures=["Gemma3ForCausalLM"])


@pytest.mark.parametrize("family,limit", [("llama", 12), ("qwen3", 16), ("gemma3", 15)])
def test_a_decode_layer_launches_at_most(family, limit):
    """The issue's bar: ≤ 12 launches for a Llama layer, ≤ 16 with QK-norm (Qwen3) or Gemma 3's four norms (whose
    pre-MLP norm takes the residual add: 15)."""
    for ops in traced_layers({"llama": llama, "qwen3": qwen3, "gemma3": gemma3}[family]()):
        print(f"{family}: {len(ops)} launches: {', '.join(ops)}")
        assert len(ops) <= limit, ops
        assert sum(op.startswith("llmctl.rms_norm") for op in ops) == {"llama": 2, "qwen3": 4, "gemma3": 6}[family]
        assert ops.count("aten.add.Tensor") == 1  # the other residual add is fused into a norm
        assert "llmctl.rotary_store.default" in ops and "aten.clone.default" not in ops  # no .contiguous() copy
