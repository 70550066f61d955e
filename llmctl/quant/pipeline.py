"""Layer-by-layer quantization of decoder checkpoints (the families in llmctl.quant.families).

Only one decoder layer's weights are in memory at a time, plus the calibration hidden
states. Each layer is calibrated on the outputs of the layers before it *after* they were
quantized, so errors do not compound unseen.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
from llmctl.errors import LlmctlError
from llmctl.quant.awq import ScaleGroup, apply_scales, clip_weights, search_scales
from llmctl.quant.families import (
    DENSE_TOWERS,
    NO_AWQ,
    SUPPORTED_TYPES,
    LayerInputs,
    attention_implementation,
    embedding_scale,
    is_gemma,
    language_model_prefix,
    mlp_norm,
    quantized_linears,
)
from llmctl.quant.gptq import LayerHessians, gptq_quantize
from llmctl.quant.moe_experts import ExpertNames, expert_names, load_experts, quantize_experts
from llmctl.quant.rtn import QuantConfig, rtn_quantize
from llmctl.quant.smoothquant import smooth_layer

BATCH = 8  # calibration sequences per forward


@dataclass
class LayerReport:
    index: int
    seconds: float


@dataclass
class QuantizationResult:
    tensors: dict[str, torch.Tensor]  # the checkpoint to write: packed linears + 16-bit rest
    dequantized: dict[str, torch.Tensor]  # the same model with dense float weights (for evaluation)
    layers: list[LayerReport] = field(default_factory=list)
    dense_towers: tuple[str, ...] = ()  # a multimodal checkpoint's other towers, written unquantized


class CheckpointReader:
    """Tensors by name across the safetensors shards of a model folder, read on demand."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        from llmctl.checkpoint.weights import safetensors_files

        self.handles = {}
        self.where: dict[str, Any] = {}
        for path in safetensors_files(folder):
            handle = safe_open(str(path), framework="pt")
            self.handles[path] = handle
            for name in handle.keys():
                self.where[name] = handle

    def get(self, name: str) -> torch.Tensor:
        if name not in self.where:
            raise LlmctlError(f"the checkpoint has no tensor {name}")
        return self.where[name].get_tensor(name).float()

    def names(self, prefix: str) -> list[str]:
        return [n for n in self.where if n.startswith(prefix)]


GROUP_SIZES = (32, 64, 128)  # the group sizes vLLM's GPTQ/AWQ kernels take (and -1, per channel)


def _grouped_sizes(hf_config: Any) -> dict[str, int]:
    """The input sizes of the quantized linears: each must be a multiple of the group size."""
    hf_config = hf_config.get_text_config()
    sizes = {"hidden size": hf_config.hidden_size, "intermediate size": hf_config.intermediate_size}
    for setting in ("moe_intermediate_size", "shared_expert_intermediate_size"):  # Qwen-MoE's experts
        if getattr(hf_config, setting, None):
            sizes[setting.replace("_", " ")] = getattr(hf_config, setting)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    sizes["attention output size"] = hf_config.num_attention_heads * head_dim
    return sizes


def working_group_sizes(hf_config: Any) -> list[int]:
    return [g for g in GROUP_SIZES if all(size % g == 0 for size in _grouped_sizes(hf_config).values())]


def check_supported(hf_config: Any, config: QuantConfig, method: str | None = None) -> None:
    outer, hf_config = hf_config.model_type, hf_config.get_text_config()
    if hf_config.model_type not in SUPPORTED_TYPES or (outer != hf_config.model_type and outer not in DENSE_TOWERS):
        raise LlmctlError(f"llmctl quantize supports these model types: {', '.join(SUPPORTED_TYPES)} (and "
                          f"{', '.join(DENSE_TOWERS)}'s language model); this one is {outer}")
    if method == "awq" and hf_config.model_type in NO_AWQ:
        raise LlmctlError(f"--awq: {NO_AWQ[hf_config.model_type]}; use --gptq")
    if config.group_size == -1:
        return
    sizes = _grouped_sizes(hf_config)
    bad = {name: size for name, size in sizes.items() if size % config.group_size}
    if bad:
        works = working_group_sizes(hf_config)
        described = ", ".join(f"{name} {size}" for name, size in bad.items())
        hint = f"use --group-size {' or '.join(map(str, works))}" if works else "use --group-size -1 (per channel)"
        raise LlmctlError(f"group size {config.group_size} does not divide the {described}: {hint}")


def quantize_model(folder: Path, method: str, config: QuantConfig, calibration: torch.Tensor,
                   on_layer: Callable[[int, int], None] | None = None, smooth: bool = False) -> QuantizationResult:
    """calibration: [samples, seq_len] token ids. method: gptq | awq | rtn. smooth: SmoothQuant each layer
    first (the W8A8 recipe, llmctl.quant.smoothquant)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    outer = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    check_supported(outer, config, method)
    hf_config = outer.get_text_config()  # a multimodal checkpoint's language model; else the model itself
    hf_config._attn_implementation = attention_implementation(hf_config)
    reader = CheckpointReader(folder)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    rotary = type(skeleton.model.rotary_emb)(config=hf_config)
    result = QuantizationResult({}, {}, dense_towers=DENSE_TOWERS.get(outer.model_type, ()))
    model_prefix = language_model_prefix(reader.where)
    embed = reader.get(f"{model_prefix}embed_tokens.weight")
    hidden = embed[calibration] * embedding_scale(hf_config)  # [samples, seq, hidden]
    inputs = LayerInputs(hf_config, rotary, torch.arange(calibration.shape[1]).unsqueeze(0))
    for index in range(hf_config.num_hidden_layers):
        started = time.perf_counter()
        hidden = _quantize_one_layer(skeleton.model.layers[index], index, hidden, reader, model_prefix, inputs,
                                     method, config, smooth, result)
        result.layers.append(LayerReport(index, time.perf_counter() - started))
        if on_layer:
            on_layer(index + 1, hf_config.num_hidden_layers)
    for name in reader.where:  # embeddings, final norm, head; a multimodal checkpoint's other towers
        if not name.startswith(f"{model_prefix}layers."):
            tensor = reader.get(name)
            result.tensors[name] = tensor.to(torch.float16)
            result.dequantized[name] = tensor
    return result


def _quantize_one_layer(layer: nn.Module, index: int, hidden: torch.Tensor, reader: CheckpointReader,
                        model_prefix: str, inputs: LayerInputs, method: str, config: QuantConfig, smooth: bool,
                        result: QuantizationResult) -> torch.Tensor:
    """Quantize decoder layer `index` on `hidden` (its calibration inputs), store it in `result`, and return
    what the quantized layer makes of `hidden` (the next layer's inputs)."""
    position_embeddings, mask = inputs.for_layer(index, hidden[:1])
    layer.to_empty(device="cpu")
    prefix = f"{model_prefix}layers.{index}."
    names = expert_names(inputs.hf_config.model_type, layer)
    _load_layer(layer, reader, prefix, names)
    run = _layer_runner(layer, position_embeddings, inputs.positions, mask)
    linears = quantized_linears(inputs.hf_config, layer)
    if smooth:
        smooth_layer(layer, functools.partial(_capture_inputs, layer, hidden, run))
    quantized = _quantize_layer(layer, hidden, run, method, config, linears, position_embeddings, mask)
    experts = quantize_experts(layer, hidden, run, config, names, BATCH) if names else {}
    with torch.no_grad():
        for name, weight in quantized.items():
            _module(layer, name).weight.copy_(weight.dequantize())
        hidden = torch.cat([run(hidden[i:i + BATCH]) for i in range(0, hidden.shape[0], BATCH)])
    _store_layer(result, layer, prefix, {**quantized, **experts}, method, linears, names)
    layer.to("meta")
    return hidden


def _module(layer: nn.Module, dotted: str) -> nn.Linear:
    module = layer
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _load_layer(layer: nn.Module, reader: CheckpointReader, prefix: str, names: ExpertNames | None) -> None:
    with torch.no_grad():
        for name, param in layer.named_parameters():
            if names is None or not name.startswith("mlp.experts."):
                param.copy_(reader.get(prefix + (names.disk_name(name) if names else name)))
    if names is not None:
        load_experts(layer, reader.get, prefix, names)


def _layer_runner(layer: nn.Module, position_embeddings: tuple, positions: torch.Tensor,
                  mask: torch.Tensor | None) -> Callable:
    def run(hidden: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            cos, sin = (t.expand(hidden.shape[0], *t.shape[1:]) for t in position_embeddings)
            out = layer(hidden, attention_mask=mask, position_ids=positions.expand(hidden.shape[0], -1),
                        position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out
    return run


def _capture_inputs(layer: nn.Module, hidden: torch.Tensor, run: Callable, names: tuple[str, ...],
                    consume: Callable[[str, torch.Tensor], None]) -> None:
    """Run the layer over the calibration batch and hand each linear's inputs to `consume`."""
    hooks = [_module(layer, name).register_forward_hook(
        lambda module, args, output, name=name: consume(name, args[0].detach())) for name in names]
    try:
        for i in range(0, hidden.shape[0], BATCH):
            run(hidden[i:i + BATCH])
    finally:
        for hook in hooks:
            hook.remove()


def _quantize_layer(layer: nn.Module, hidden: torch.Tensor, run: Callable, method: str, config: QuantConfig,
                    linears: tuple[str, ...], position_embeddings: tuple,
                    mask: torch.Tensor | None) -> dict[str, QuantizedWeight]:
    if method == "gptq":
        hessians = LayerHessians()
        _capture_inputs(layer, hidden, run, linears, hessians.add)
        return _gptq_by_shared_input(layer, hessians, config, linears)
    if method == "awq":
        _awq_transform(layer, hidden, run, config, position_embeddings, mask)
    return {name: rtn_quantize(_module(layer, name).weight, config) for name in linears}


def _gptq_by_shared_input(layer: nn.Module, hessians: LayerHessians, config: QuantConfig,
                          linears: tuple[str, ...]) -> dict[str, QuantizedWeight]:
    """GPTQ treats each output row apart under one Hessian, so the linears that read one input (q/k/v,
    gate/up) are quantized as one stacked matrix: the same values in fewer, wider column steps."""
    quantized: dict[str, QuantizedWeight] = {}
    for owner in dict.fromkeys(hessians.owner[name] for name in linears):
        names = [name for name in linears if hessians.owner[name] == owner]
        weights = [_module(layer, name).weight for name in names]
        stacked = gptq_quantize(torch.cat(weights), hessians.hessian(owner), config)
        quantized.update(zip(names, stacked.split_rows([w.shape[0] for w in weights])))
    return {name: quantized[name] for name in linears}


def _awq_transform(layer: nn.Module, hidden: torch.Tensor, run: Callable, config: QuantConfig,
                   position_embeddings: tuple, mask: torch.Tensor | None) -> None:
    attn = layer.self_attn

    def attention_block(states: torch.Tensor) -> torch.Tensor:
        cos, sin = (t.expand(states.shape[0], *t.shape[1:]) for t in position_embeddings)
        return attn(states, attention_mask=mask, position_embeddings=(cos, sin))[0]

    groups = _scale_groups(layer, hidden, run, attention_block)
    scales = [search_scales(group, config) for group in groups]  # all on the unmodified layer, as AutoAWQ
    for group, scale in zip(groups, scales):
        apply_scales(group, scale)
        group.inputs.div_(scale)  # what the linears now read
    query_key = [getattr(attn, name) for name in ("q_proj", "k_proj", "qkv_proj") if hasattr(attn, name)]
    for group in groups:
        for linear in group.linears:
            if linear not in query_key:  # query/key clipping hurts attention (AutoAWQ skips it)
                clip_weights(linear, group.inputs, config)


def _scale_groups(layer: nn.Module, hidden: torch.Tensor, run: Callable, attention_block: Callable) -> list[ScaleGroup]:
    """AutoAWQ's four groups: norm → q/k/v, v → o (without KV-head sharing), norm → gate/up, up → down.
    In fused layers (Phi-3) v and up are the last rows of qkv_proj and gate_up_proj."""
    attn, mlp = layer.self_attn, layer.mlp
    fused = hasattr(attn, "qkv_proj")
    first = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj") if fused else \
        ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj")
    inputs: dict[str, list[torch.Tensor]] = {}
    _capture_inputs(layer, hidden, run, first + ("mlp.down_proj",),
                    lambda name, x: inputs.setdefault(name, []).append(x))
    x = [torch.cat(inputs[name]) for name in first + ("mlp.down_proj",)]
    qkv = [attn.qkv_proj] if fused else [attn.q_proj, attn.k_proj, attn.v_proj]
    gate_up = [mlp.gate_up_proj] if fused else [mlp.gate_proj, mlp.up_proj]
    offset = is_gemma(attn.config)  # Gemma's norms scale by (1 + weight)
    groups = [ScaleGroup(layer.input_layernorm, qkv, x[0], attention_block, unit_offset=offset),
              ScaleGroup(mlp_norm(layer), gate_up, x[2], mlp, unit_offset=offset),
              ScaleGroup(gate_up[-1], [mlp.down_proj], x[3], mlp.down_proj)]
    if attn.o_proj.in_features == attn.config.num_key_value_heads * attn.head_dim:  # v -> o: no KV-head sharing
        groups.insert(1, ScaleGroup(qkv[-1], [attn.o_proj], x[1], attn.o_proj))
    return groups


def _store_layer(result: QuantizationResult, layer: nn.Module, prefix: str, quantized: dict[str, QuantizedWeight],
                 method: str, linears: tuple[str, ...], names: ExpertNames | None) -> None:
    pack = pack_gptq if method == "gptq" else pack_awq
    for name, weight in quantized.items():
        for suffix, tensor in pack(weight).items():
            result.tensors[f"{prefix}{name}.{suffix}"] = tensor
        result.dequantized[f"{prefix}{name}.weight"] = weight.dequantize()
    for name, param in layer.named_parameters():
        if names is not None and name.startswith("mlp.experts."):
            continue  # stored expert by expert above
        if not any(name.startswith(linear) for linear in linears) or name.endswith(".bias"):
            disk = prefix + (names.disk_name(name) if names else name)
            result.tensors[disk] = param.detach().to(torch.float16)
            result.dequantized[disk] = param.detach().clone()
