"""Checkpoints in compressed-tensors' format, as llm-compressor saves them (`llmctl quantize --scheme fp8-dynamic`).

- `w4a16` / `w8a16`: llmctl's GPTQ (symmetric, calibrated layer by layer, llmctl.quant.gptq), its integers
  packed with compressed-tensors' own `pack_to_int32` into `pack-quantized` tensors.
- `w8a8`: llm-compressor's W8A8 recipe: SmoothQuant (llmctl.quant.smoothquant), then GPTQ with int8 weights per
  output channel, stored `int-quantized` (int8 `weight`, `weight_scale`); activations quantized per token at
  run time (int8, dynamic, symmetric).
- `fp8-dynamic`: llm-compressor's FP8_DYNAMIC recipe, which needs no calibration: float8 e4m3 weights with a
  min-max scale per output channel, activations quantized per token at run time. compressed-tensors applies
  the scheme, computes the scales (`calculate_qparams`) and compresses the model itself.

Either way the `quantization_config` in config.json is written by compressed-tensors' ModelCompressor, so
transformers, vLLM and llmctl read the folder as they read llm-compressor's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from llmctl.checkpoint.quant_formats import unpack_gptq

SCHEMES = ("w4a16", "w8a16", "w8a8", "fp8-dynamic")


def gptq_as_compressed(tensors: dict[str, torch.Tensor], bits: int, group_size: int,
                       packed: bool = True) -> dict[str, torch.Tensor]:
    """GPTQ v1 tensors (qweight, qzeros, scales, g_idx per linear) as compressed-tensors pack-quantized ones
    (weight_packed, weight_scale, weight_shape), or int-quantized ones (`packed` False, 8 bits: an int8 weight and
    weight_scale); every other tensor as it is."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    out = {name: tensor for name, tensor in tensors.items()
           if not name.endswith((".qweight", ".qzeros", ".scales", ".g_idx"))}
    offset = 1 << (bits - 1)
    for module in [name.removesuffix(".qweight") for name in tensors if name.endswith(".qweight")]:
        weight = unpack_gptq({kind: tensors[f"{module}.{kind}"] for kind in ("qweight", "qzeros", "scales")},
                             bits, group_size)
        if not bool((weight.zeros == offset).all()):
            raise ValueError(f"{module}: GPTQ zero points other than {offset}: not symmetric")
        signed = (weight.q - offset).to(torch.int8)
        out[f"{module}.weight_scale"] = tensors[f"{module}.scales"].t().contiguous()  # [out, groups], float16
        if not packed:
            out[f"{module}.weight"] = signed
            continue
        out[f"{module}.weight_packed"] = pack_to_int32(signed, bits)
        out[f"{module}.weight_shape"] = torch.tensor(list(weight.q.shape), dtype=torch.int64)
    return out


def gptq_scheme_config(bits: int, group_size: int, ignore: list[str], int8_tokens: bool = False) -> Any:
    """compressed-tensors' QuantizationConfig of symmetric int weights, per group (or per channel: -1); with
    `int8_tokens`, activations quantized to int8 per token at run time (W8A8, `int-quantized`)."""
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
    )

    grouped = group_size > 0
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=True, strategy="group" if grouped else "channel",
                               group_size=group_size if grouped else None)
    tokens = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True) \
        if int8_tokens else None
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=tokens)
    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore,
                              format="int-quantized" if int8_tokens else "pack-quantized",
                              quantization_status=QuantizationStatus.COMPRESSED)


def write_scheme_config(folder: Path, config: Any) -> None:
    """config.json's quantization_config, written by compressed-tensors' ModelCompressor."""
    from compressed_tensors.compressors import ModelCompressor

    ModelCompressor(quantization_config=config).update_config(str(folder))


def _min_max_scales(module: Any) -> None:  # an nn.Linear carrying compressed-tensors' scheme and params
    """A linear's weight scales (and zero points) from its min and max, in the shapes compressed-tensors gave
    them (per channel, group, block or tensor; NVFP4's groups under a global scale from `generate_gparam`), by
    compressed-tensors' own `calculate_qparams`."""
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    args = module.quantization_scheme.weights
    weight = module.weight.detach().float()
    global_scale = None
    if args.strategy == "tensor_group":  # NVFP4: a global scale over the group scales, from the tensor's range
        global_scale = generate_gparam(weight.min().reshape(1), weight.max().reshape(1))
        module.weight_global_scale.data.copy_(global_scale.reshape(module.weight_global_scale.shape))
    if args.strategy in ("group", "tensor_group"):
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
    scale, zero_point = calculate_qparams(low, high, args, global_scale=global_scale)
    module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data.copy_(zero_point.reshape(module.weight_zero_point.shape))


def round_to_nearest(base: Path, out: Path, preset: str, dtype: torch.dtype = torch.bfloat16,
                     ignore: tuple[str, ...] = ("lm_head",), group_size: int | None = None) -> Path:
    """`base` in compressed-tensors' preset scheme (FP8_DYNAMIC, W4A16, W8A8, ...; `group_size` overrides a
    grouped preset's) with min-max scales — no calibration — saved as compressed-tensors writes it (weights,
    config.json; the caller adds the tokenizer and the rest)."""
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
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore),
                                quantization_status=QuantizationStatus.FROZEN)
    apply_quantization_config(model, config)
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            _min_max_scales(module)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    return out
