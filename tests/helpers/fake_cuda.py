"""A model's CUDA path run without a GPU: parameters and step tensors are FakeTensors on device "cuda" (torch's
FakeTensorMode; the Triton launches are registered ops with fake implementations, llmctl.engine.layers.fused_ops
and attention_ops). The launch-count and host-synchronization tests trace one decode step through it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

BATCH, BLOCK_SIZE, BLOCKS = 4, 16, 8


@dataclass
class FakeCudaStep:
    """A model on fake CUDA and one decode step's context for it (use inside `mode`, under no_grad)."""

    model: Any
    spec: Any
    mode: FakeTensorMode
    ctx: Any = None
    input_ids: torch.Tensor | None = None


def fake_cuda_step(config) -> FakeCudaStep:
    """`config`'s model in bfloat16 on fake CUDA, with a decode step of BATCH sequences: call inside
    `with step.mode, torch.no_grad():` and then `step.prepare()`."""
    from llmctl.checkpoint.spec import build_spec
    from llmctl.engine.models.registry import create_model

    spec = build_spec(config.to_dict())
    with torch.device("meta"):
        model = create_model(spec, config, impl="llmctl")
    mode = FakeTensorMode()
    model._apply(lambda t: on_fake_gpu(mode, t, torch.bfloat16 if t.is_floating_point() and t.dim() > 0
                                       and t.dtype != torch.float32 or isinstance(t, torch.nn.Parameter) else None))
    return FakeCudaStep(model, spec, mode)


def on_fake_gpu(mode: FakeTensorMode, tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    meta = tensor.to("meta", dtype=dtype or tensor.dtype)
    return FakeTensor(mode, meta, torch.device("cuda"))


def prepare(step: FakeCudaStep) -> None:
    """The decode step's tensors (inside the fake mode): each sequence at position 19, one token."""
    from llmctl.engine.layers.attention import KVCache
    from llmctl.engine.layers.triton_attention import StepTensors, TritonAttention
    from llmctl.engine.models.common import StepContext
    from llmctl.kernels.attention import plan_step

    att = step.spec.attention
    planned = plan_step(list(range(BATCH + 1)), att.num_heads, att.num_kv_heads, torch.device("cpu"))
    layout = dataclasses.replace(planned, **{name: on_fake_gpu(step.mode, getattr(planned, name))
                                             for name in ("query_start_loc", "block_seq", "block_first")})
    cuda = torch.device("cuda")
    backend = TritonAttention()
    backend.use_static(StepTensors(
        slot_mapping=torch.arange(BATCH, device=cuda, dtype=torch.int64) * BLOCK_SIZE,
        block_tables=torch.zeros(BATCH, 2, dtype=torch.int32, device=cuda),
        seq_lens=torch.full((BATCH,), 20, dtype=torch.int32, device=cuda),
        layout=layout,
        query_start_loc=list(range(BATCH + 1)), sliding_window=None))
    caches = {i: KVCache(torch.empty(BLOCKS, BLOCK_SIZE, 2, att.num_kv_heads, att.head_dim,
                                     dtype=torch.bfloat16, device=cuda)) for i in range(step.spec.num_layers)}
    step.ctx = StepContext(torch.full((BATCH,), 19, dtype=torch.int64, device=cuda), caches, backend)
    step.input_ids = torch.zeros(BATCH, dtype=torch.int64, device=cuda)


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


def mixtral():
    from transformers import MixtralConfig

    return MixtralConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                         architectures=["MixtralForCausalLM"])


FAMILIES = {"llama": llama, "qwen3": qwen3, "gemma3": gemma3, "mixtral": mixtral}


class FakeCudaIndexing(torch.overrides.TorchFunctionMode):
    """Python indexing of fake CUDA tensors (x[rows], x[..., :n] = v): a CPU-only torch cannot take it (its
    device guard needs CUDA), so it runs on meta twins of the same shapes and the result is a fresh fake CUDA
    tensor — shapes are all a fake tensor has. An index by a boolean mask is recorded: its size depends on
    values, which makes a host wait for the device."""

    def __init__(self) -> None:
        super().__init__()
        self.masks = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func not in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) or args[0].device.type != "cuda":
            return func(*args, **(kwargs or {}))
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        self.masks += sum(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        meta = tuple(_meta(i) for i in index)
        if func is torch.Tensor.__setitem__:
            _meta(args[0])[meta] = _meta(args[2])  # checks that the value fits; a fake tensor keeps no values
            return None
        result = _meta(args[0])[meta]
        return torch.empty(result.shape, dtype=result.dtype, device="cuda")


def _meta(value):  # type: ignore[no-untyped-def]
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    return value
