"""Decode steps of Llama-shaped layers over GGUF codes: one C++ call per layer (kernels/cpu_decode_layer.cpp).

Decoding a small GGUF model on a CPU, the ops of a token took about as long as the time between them: Python's
module calls, and the kernels' second thread starting again after each pause. For a step whose every token
attends through the paged cache (decoding), a layer that qualifies runs as one call of the same ops in the
same order, so its results are the Python layer's bit for bit (tests/test_coded_decode.py). A layer qualifies
when it is exactly LlamaDecoderLayer's arithmetic: Llama attention (no q/k norms, soft-cap or residual
multiplier), the SiLU MLP, every linear GGUF codes with int8 activations in 32-wide groups, no LoRA, one
tensor-parallel rank, float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from llmctl.engine.layers.coded_linear import CodedLinear, CodedWeight
from llmctl.engine.layers.cpu_attention import CPUAttention
from llmctl.engine.models.common import RMSNorm, StepContext


@dataclass
class CodedLayer:
    """One layer's arguments to the C++ op that do not change from step to step."""

    norms: list[torch.Tensor]
    eps: float
    linears: list[torch.Tensor]  # codes, scales, offsets of qkv, o, gate_up, down
    offsets_used: list[int]
    qkv_bias: torch.Tensor | None
    heads: list[int]  # query heads, KV heads, head size
    scale: float
    window: int | None


def _coded(linear: nn.Module, bias_allowed: bool) -> CodedWeight | None:
    """The layer's coded weight where the fused op can run it: GGUF codes, int8 activations, no LoRA."""
    inner = getattr(linear, "inner", None)
    if not isinstance(inner, CodedLinear) or getattr(linear, "lora", None) is not None:
        return None
    if getattr(linear, "bias", None) is not None or (inner.bias is not None and not bias_allowed):
        return None
    coded = inner.coded
    return coded if coded is not None and coded.int8_activations and coded.group_size == 32 else None


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
    weights = [_coded(att.qkv_proj, True), _coded(att.o_proj, False), _coded(mlp.gate_up_proj, False),
               _coded(mlp.down_proj, False)]
    if any(w is None for w in weights):
        return None
    return CodedLayer(norms=[n.weight.data for n in norms], eps=norms[0].eps,
                      linears=[t for w in weights for t in (w.codes, w.scales, w.offsets)],
                      offsets_used=[int(w.offsets_used) for w in weights], qkv_bias=att.qkv_proj.inner.bias,
                      heads=[att.num_heads, att.num_kv_heads, att.head_dim], scale=att.scale, window=att.window)


def coded_layers(layers: nn.ModuleList, indices: range, plain: PlainLlama) -> dict[int, CodedLayer] | None:
    """Every layer's arguments, or None unless every layer of the stage qualifies."""
    found = {index: coded_layer(layers[index], plain) for index in indices}
    return None if not found or any(v is None for v in found.values()) else found


def step_attention(ctx: StepContext, rotary: nn.Module, dtype: torch.dtype) -> list[torch.Tensor] | None:
    """The step's part of the op's `attention` argument (the cache is added per layer), or None where the
    step has tokens outside the paged kernel (prompts through torch) or a cache the op does not read."""
    backend = ctx.backend
    if not isinstance(backend, CPUAttention) or backend.paged is None or backend.paged_rows is not None:
        return None
    cos, sin = rotary._cos_sin(ctx.positions, dtype, ctx.lengths)
    tables, lens, starts = backend.paged
    return [backend.meta.slot_mapping, tables, lens, starts, cos.squeeze(1), sin.squeeze(1)]


def run_layer(layer: CodedLayer, x: torch.Tensor, ctx: StepContext, attention: list[torch.Tensor],
              index: int) -> torch.Tensor:
    window = layer.window or ctx.backend.meta.sliding_window or 0
    return torch.ops.llmctl_cpu.coded_decoder_layer(
        x, layer.norms, layer.eps, layer.linears, layer.offsets_used, layer.qkv_bias,
        [ctx.kv_caches[index].kv, *attention], layer.heads, layer.scale, window)
