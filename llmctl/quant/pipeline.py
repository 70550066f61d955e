"""Layer-by-layer quantization of Llama-family checkpoints (Llama, Mistral, Qwen2, Qwen3, Granite,
SmolLM2).

Only one decoder layer's weights are in memory at a time, plus the calibration hidden
states. Each layer is calibrated on the outputs of the layers before it *after* they were
quantized, so errors do not compound unseen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from llmctl.errors import LlmctlError
from llmctl.quant.awq import ScaleGroup, apply_scales, clip_weights, search_scales
from llmctl.quant.families import (NO_AWQ, SUPPORTED_TYPES, LayerInputs, attention_implementation,
                                   embedding_scale, is_gemma, mlp_norm)
from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
from llmctl.quant.gptq import HessianAccumulator, gptq_quantize
from llmctl.quant.rtn import QuantConfig, rtn_quantize

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
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
    sizes = {"hidden size": hf_config.hidden_size, "intermediate size": hf_config.intermediate_size}
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    sizes["attention output size"] = hf_config.num_attention_heads * head_dim
    return sizes


def working_group_sizes(hf_config: Any) -> list[int]:
    return [g for g in GROUP_SIZES if all(size % g == 0 for size in _grouped_sizes(hf_config).values())]


def check_supported(hf_config: Any, config: QuantConfig, method: str | None = None) -> None:
    if hf_config.model_type not in SUPPORTED_TYPES:
        raise LlmctlError(f"llmctl quantize supports these model types: {', '.join(SUPPORTED_TYPES)}; "
                          f"this one is {hf_config.model_type}")
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
                   on_layer: Callable[[int, int], None] | None = None) -> QuantizationResult:
    """calibration: [samples, seq_len] token ids. method: gptq | awq | rtn."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    check_supported(hf_config, config, method)
    hf_config._attn_implementation = attention_implementation(hf_config)
    reader = CheckpointReader(folder)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    rotary = type(skeleton.model.rotary_emb)(config=hf_config)
    result = QuantizationResult({}, {})
    embed = reader.get("model.embed_tokens.weight")
    hidden = embed[calibration] * embedding_scale(hf_config)  # [samples, seq, hidden]
    inputs = LayerInputs(hf_config, rotary, torch.arange(calibration.shape[1]).unsqueeze(0))
    for index in range(hf_config.num_hidden_layers):
        position_embeddings, mask = inputs.for_layer(index, hidden[:1])
        started = time.perf_counter()
        layer = skeleton.model.layers[index]
        layer.to_empty(device="cpu")
        prefix = f"model.layers.{index}."
        _load_layer(layer, reader, prefix)
        run = _layer_runner(layer, position_embeddings, inputs.positions, mask)
        quantized = _quantize_layer(layer, hidden, run, method, config, position_embeddings, mask)
        with torch.no_grad():
            for name, weight in quantized.items():
                _module(layer, name).weight.copy_(weight.dequantize())
            hidden = torch.cat([run(hidden[i:i + BATCH]) for i in range(0, hidden.shape[0], BATCH)])
        _store_layer(result, layer, prefix, quantized, method)
        layer.to("meta")
        result.layers.append(LayerReport(index, time.perf_counter() - started))
        if on_layer:
            on_layer(index + 1, hf_config.num_hidden_layers)
    for name in reader.where:
        if not name.startswith("model.layers."):
            tensor = reader.get(name)
            result.tensors[name] = tensor.to(torch.float16)
            result.dequantized[name] = tensor
    return result


def _module(layer: nn.Module, dotted: str) -> nn.Linear:
    module = layer
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def _load_layer(layer: nn.Module, reader: CheckpointReader, prefix: str) -> None:
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(reader.get(prefix + name))


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
                    position_embeddings: tuple, mask: torch.Tensor | None) -> dict[str, QuantizedWeight]:
    if method == "gptq":
        accumulators = {name: HessianAccumulator(_module(layer, name).in_features) for name in LINEARS}
        _capture_inputs(layer, hidden, run, LINEARS, lambda name, x: accumulators[name].add(x))
        return {name: gptq_quantize(_module(layer, name).weight, accumulators[name].hessian(), config)
                for name in LINEARS}
    if method == "awq":
        _awq_transform(layer, hidden, run, config, position_embeddings, mask)
    return {name: rtn_quantize(_module(layer, name).weight, config) for name in LINEARS}


def _awq_transform(layer: nn.Module, hidden: torch.Tensor, run: Callable, config: QuantConfig,
                   position_embeddings: tuple, mask: torch.Tensor | None) -> None:
    inputs: dict[str, list[torch.Tensor]] = {}
    wanted = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")
    _capture_inputs(layer, hidden, run, wanted, lambda name, x: inputs.setdefault(name, []).append(x))
    x = {name: torch.cat(chunks) for name, chunks in inputs.items()}
    attn, mlp = layer.self_attn, layer.mlp

    def attention_block(states: torch.Tensor) -> torch.Tensor:
        cos, sin = (t.expand(states.shape[0], *t.shape[1:]) for t in position_embeddings)
        return attn(states, attention_mask=mask, position_embeddings=(cos, sin))[0]

    offset = is_gemma(layer.self_attn.config)  # Gemma's norms scale by (1 + weight)
    groups = [ScaleGroup(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj], x["self_attn.q_proj"],
                         attention_block, unit_offset=offset),
              ScaleGroup(mlp_norm(layer), [mlp.gate_proj, mlp.up_proj], x["mlp.gate_proj"], mlp, unit_offset=offset),
              ScaleGroup(mlp.up_proj, [mlp.down_proj], x["mlp.down_proj"], mlp.down_proj)]
    if attn.v_proj.out_features == attn.o_proj.in_features:  # v -> o only when no KV-head sharing
        groups.insert(1, ScaleGroup(attn.v_proj, [attn.o_proj], x["self_attn.o_proj"], attn.o_proj))
    scales = [search_scales(group, config) for group in groups]  # all on the unmodified layer, as AutoAWQ
    for group, scale in zip(groups, scales):
        apply_scales(group, scale)
        group.inputs.div_(scale)  # what the linears now read
    for group in groups:
        for linear in group.linears:
            if linear not in (attn.q_proj, attn.k_proj):  # query/key clipping hurts attention (AutoAWQ skips it)
                clip_weights(linear, group.inputs, config)


def _store_layer(result: QuantizationResult, layer: nn.Module, prefix: str,
                 quantized: dict[str, QuantizedWeight], method: str) -> None:
    pack = pack_gptq if method == "gptq" else pack_awq
    for name, weight in quantized.items():
        for suffix, tensor in pack(weight).items():
            result.tensors[f"{prefix}{name}.{suffix}"] = tensor
        result.dequantized[f"{prefix}{name}.weight"] = weight.dequantize()
    for name, param in layer.named_parameters():
        if not any(name.startswith(linear) for linear in LINEARS) or name.endswith(".bias"):
            result.tensors[prefix + name] = param.detach().to(torch.float16)
            result.dequantized[prefix + name] = param.detach().clone()
