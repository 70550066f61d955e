"""Decode steps of Llama-shaped layers on CPUs: one C++ call per layer (kernels/cpu_decode_layer.cpp).

Decoding a small GGUF model on a CPU, the ops of a token took about as long as the time between them: Python's
module calls, and the kernels' second thread starting again after each pause. For a step whose every token
attends through the paged cache (decoding), a layer that qualifies runs as one call of the same ops in the
same order, so its results are the Python layer's bit for bit (tests/engine/models/test_coded_decode.py). A layer qualifies
when it is exactly LlamaDecoderLayer's arithmetic: Llama attention (no q/k norms, soft-cap or residual
multiplier), the SiLU MLP, every linear codes — GGUF's with int8 activations (CodedWeight.int8_kernel), W8A8
int8 with per-token ones (CodedWeight.per_token_kernel), W8A16 int8 with float ones, or GPTQ/AWQ
4-bit repacked for the CPU (float activations) — or float32 weights (llmctl's panels from the rows cpu_gemm.linear
takes them, torch's linear below), no LoRA, no linear bias, one tensor-parallel rank, float32; and the step has
fewer than 128 tokens, all of them attending through the paged kernel. For a float32 model this is what a decode
step's host time is made of (benchmarks/engine_overhead.py: a 64-wide layer took ~150 µs of Python).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.coded_linear import DECODE_ROWS, CodedLinear
from llmctl.engine.layers.cpu_attention import CPUAttention
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import RotaryEmbedding
from llmctl.engine.layers.quant_linear import QuantLinear
from llmctl.engine.models.common import StepContext
from llmctl.kernels import cpu as cpu_kernels


@dataclass
class CodedLayer:
    """One layer's arguments to the C++ op that do not change from step to step."""

    norms: list[torch.Tensor]
    eps: float
    linears: list[torch.Tensor]  # codes, scales, offsets of qkv, o, gate_up, down (float: panels, weight, settings)
    kernels: list[int]  # Q8, Q8_WITH_OFFSETS, INT4_FLOAT or FLOAT_PANELS for each
    qkv_bias: torch.Tensor | None
    heads: list[int]  # query heads, KV heads, head size
    scale: float
    window: int | None
    panel_rows: list[tuple[int, int]] = field(default_factory=list)  # FLOAT_PANELS linears: (min_rows, max_rows)

    def kernels_for(self, rows: int) -> list[int]:
        """The kernels of a step of `rows` tokens: float32 panels only from the rows cpu_gemm.linear takes them."""
        if not self.panel_rows:
            return self.kernels
        return [FLOAT_PLAIN if kernel == FLOAT_PANELS and not _in_panel_rows(rows, limits) else kernel
                for kernel, limits in zip(self.kernels, self.panel_rows)]


def _in_panel_rows(rows: int, limits: tuple[int, int]) -> bool:
    low, high = limits
    return rows >= (low or cpu_gemm.small_batch()) and (high == 0 or rows < high)


# The C++ op's kernel numbers (kernels/cpu_decode_layer.cpp): GGUF codes through q8_linear, without or with
# offsets, or a W8A8 checkpoint's with x quantized per token; GPTQ/AWQ 4-bit codes through int4_linear, W8A16
# int8 codes through int8_linear — what CodedWeight.matmul picks for fewer than 128 rows;
# float32 weights through torch's linear or llmctl's panels — what cpu_gemm.linear picks.
Q8, Q8_WITH_OFFSETS, INT4_FLOAT, FLOAT_PLAIN, FLOAT_PANELS, Q8_PER_TOKEN, INT8_FLOAT = 0, 1, 2, 3, 4, 5, 6
NO_SETTINGS = torch.zeros(2, dtype=torch.int64)


@dataclass(frozen=True)
class OpWeight:
    """A linear as the op takes it: three tensors and a kernel (and, for panels, the rows they run from)."""

    tensors: list[torch.Tensor]
    kernel: int
    panel_rows: tuple[int, int] = (0, 0)


def _coded(linear: nn.Module, bias_allowed: bool) -> OpWeight | None:
    """The layer's weight where the fused op can run it (no LoRA, no bias where not allowed)."""
    inner = getattr(linear, "inner", None)
    if getattr(linear, "lora", None) is not None or getattr(linear, "bias", None) is not None \
            or (getattr(inner, "bias", None) is not None and not bias_allowed):
        return None
    if isinstance(inner, CodedLinear) and inner.coded is not None and inner.coded.int8_kernel:
        coded = inner.coded
        return OpWeight([coded.codes, coded.scales, coded.offsets], Q8_WITH_OFFSETS if coded.offsets_used else Q8)
    if isinstance(inner, CodedLinear) and inner.coded is not None and inner.coded.per_token_kernel:
        coded = inner.coded
        return OpWeight([coded.codes, coded.scales, coded.offsets], Q8_PER_TOKEN)
    if isinstance(inner, CodedLinear) and inner.coded is not None and inner.coded.bits == 8 \
            and inner.activation_args is None and not inner.coded.int8_activations:
        coded = inner.coded  # W8A16: int8 codes, float activations
        return OpWeight([coded.codes, coded.scales, coded.offsets], INT8_FLOAT)
    if isinstance(inner, QuantLinear) and inner.cpu_int4 is not None and not inner.cpu_int4.int8_activations:
        coded = inner.cpu_int4
        return OpWeight([coded.codes, coded.scales, coded.offsets], INT4_FLOAT)
    return _float(inner)


def _float(inner: nn.Module | None) -> OpWeight | None:
    """A float32 weight: plain, or with llmctl's float32 panels (oneDNN's packed layout stays in Python)."""
    if type(inner) is nn.Linear and inner.weight.dtype == torch.float32 and inner.bias is None:
        return OpWeight([inner.weight, inner.weight, NO_SETTINGS], FLOAT_PLAIN)
    if not isinstance(inner, cpu_gemm.PackedLinear) or inner.weight.dtype != torch.float32 or inner.bias is not None:
        return None
    packed = inner.packed
    if not packed.panels:
        return None
    settings = torch.tensor([cpu_kernels.CODED_ISAS[packed.isa], int(packed.amx)], dtype=torch.int64)
    return OpWeight([packed.data, inner.weight, settings], FLOAT_PANELS, (packed.min_rows, packed.max_rows))


@dataclass(frozen=True)
class PlainLlama:
    """llama.py's classes whose arithmetic the op repeats (passed in: llama.py imports this module)."""

    layer: type
    attention: type
    mlp: type


def coded_layer(layer: nn.Module, plain: PlainLlama) -> CodedLayer | None:
    """The op's arguments for `layer`, or None where it is not plain LlamaDecoderLayer arithmetic."""
    att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if type(layer).forward is not plain.layer.forward or type(att) is not plain.attention \
            or type(mlp) is not plain.mlp or layer.residual != 1.0 or att.q_norm is not None or att.softcap:
        return None
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if any(type(norm) is not RMSNorm or norm.weight.dtype != torch.float32 for norm in norms) \
            or norms[0].eps != norms[1].eps or mlp.down_proj.group.size != 1:
        return None
    found = [_coded(att.qkv_proj, True), _coded(att.o_proj, False), _coded(mlp.gate_up_proj, False),
             _coded(mlp.down_proj, False)]
    if any(f is None for f in found):
        return None
    qkv_bias = att.qkv_proj.inner.bias
    return CodedLayer(norms=[n.weight.data for n in norms], eps=norms[0].eps,
                      linears=[t for w in found for t in w.tensors],  # type: ignore[union-attr]
                      kernels=[w.kernel for w in found],  # type: ignore[union-attr]
                      qkv_bias=None if qkv_bias is None else qkv_bias.data,
                      heads=[att.num_heads, att.num_kv_heads, att.head_dim], scale=att.scale, window=att.window,
                      panel_rows=[w.panel_rows for w in found])  # type: ignore[union-attr]


def coded_layers(layers: nn.ModuleList, indices: range, plain: PlainLlama) -> dict[int, CodedLayer] | None:
    """Every layer's arguments, or None unless every layer of the stage qualifies."""
    found = {index: coded_layer(layers[index], plain) for index in indices}
    return None if not found or any(v is None for v in found.values()) else found


def step_attention(ctx: StepContext, rotary: RotaryEmbedding, dtype: torch.dtype) -> list[torch.Tensor] | None:
    """The step's part of the op's `attention` argument (the cache is added per layer), or None where the
    step has tokens outside the paged kernel (prompts through torch) or a cache the op does not read."""
    backend = ctx.backend
    if not isinstance(backend, CPUAttention) or backend.paged is None or backend.paged_rows is not None \
            or ctx.positions.shape[-1] >= DECODE_ROWS:  # [T], or M-RoPE's [3, T]; from 128 rows: the Python layers (CodedWeight.matmul picks)
        return None
    cos, sin = rotary.cos_sin(ctx.positions, dtype, ctx.lengths)
    tables, lens, starts = backend.paged
    return [backend.meta.slot_mapping, tables, lens, starts, cos.squeeze(1), sin.squeeze(1)]


def run_layer(layer: CodedLayer, x: torch.Tensor, ctx: StepContext, attention: list[torch.Tensor],
              index: int) -> torch.Tensor:
    window = layer.window or ctx.backend.meta.sliding_window or 0
    return torch.ops.llmctl_cpu.coded_decoder_layer(
        x, layer.norms, layer.eps, layer.linears, layer.kernels_for(x.shape[0]), layer.qkv_bias,
        [ctx.kv_caches[index].kv, *attention], layer.heads, layer.scale, window)
