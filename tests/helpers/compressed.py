"""compressed-tensors checkpoints written by the compressed-tensors library itself (the format llm-compressor
saves): a random model's linears get round-to-nearest min-max scales (compressed-tensors' own
`calculate_qparams`), then the library's ModelCompressor packs and saves them with their config."""

from __future__ import annotations

from pathlib import Path

import torch


def _weight_qparams(module: torch.nn.Module) -> None:
    """Min-max scales (and zero points) of one linear's weight, in the shapes the library gave its params."""
    from compressed_tensors.quantization.utils import calculate_qparams

    args = module.quantization_scheme.weights
    weight = module.weight.detach().float()
    if args.strategy == "group":
        weight = weight.unflatten(-1, (-1, args.group_size))
        low, high = weight.amin(dim=-1), weight.amax(dim=-1)
    elif args.strategy == "channel":
        low, high = weight.amin(dim=-1, keepdim=True), weight.amax(dim=-1, keepdim=True)
    elif args.strategy == "block":
        rows, cols = args.block_structure
        blocks = weight.unflatten(0, (-1, rows)).unflatten(-1, (-1, cols))
        low, high = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    else:
        low, high = weight.min().reshape(1), weight.max().reshape(1)
    scale, zero_point = calculate_qparams(low, high, args)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero_point.reshape(module.weight_zero_point.shape))


def compressed_checkpoint(base: Path, preset: str, out: Path, tokenizer, dtype: torch.dtype = torch.bfloat16,
                          ignore: tuple[str, ...] = ("lm_head",), group_size: int | None = None) -> Path:
    """`base` quantized with compressed-tensors' preset scheme `preset` (W4A16, W8A16, W8A8, FP8_DYNAMIC,
    FP8_BLOCK, ...; `group_size` overrides a grouped preset's) and saved as compressed-tensors writes it."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if group_size is not None:
        scheme = scheme.model_copy(update={"weights": scheme.weights.model_copy(update={"group_size": group_size})})
    config = QuantizationConfig(config_groups={"group_0": scheme},
                                ignore=list(ignore), quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config)
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            _weight_qparams(module)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    tokenizer.save_pretrained(str(out))
    return out
