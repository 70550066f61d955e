"""Pre-quantized weights turned, as they are read, into the tensors the engine's layers load.

Each converter follows compressed-tensors' model-free `Converter` protocol: `get_dependencies(name)`
names the tensors a root tensor is decoded with, `process(tensors)` decodes them
(llmctl.checkpoint.converted_stream feeds them group by group). Where the library has one, it is
the library's: `CompressedTensorsDequantizer` (every compressed-tensors format it reads, through its
own compressors) and `FP8BlockDequantizer` (block-wise fp8). llmctl's own are small:
- `Fp8ScaleDequantizer`: fp8 weights with one scale per tensor or per output channel;
- `PackedToGptq`: compressed-tensors 4-bit integer weights kept quantized, unpacked with the library's
  `unpack_from_int32` and written as GPTQ tensors (the engine's int4 kernels read those).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.gguf_codes import GroupCodes
from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_gptq, unpack_awq, unpack_gptq
from llmctl.checkpoint.quant_schemes import FP8_CHANNEL_ROWS, compressed_format
from llmctl.errors import CorruptModelError


class Converter(Protocol):
    def get_dependencies(self, weight_name: str) -> set[str]: ...

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


class Fp8ScaleDequantizer:
    """`weight` (float8_e4m3fn) × `weight_scale` (a scalar, or one per output channel), in `dtype`."""

    def __init__(self, names: set[str], dtype: torch.dtype) -> None:
        self.scaled = {name.rpartition(".")[0] for name in names if name.endswith(".weight_scale")}
        self.dtype = dtype

    def get_dependencies(self, weight_name: str) -> set[str]:
        module, _, param = weight_name.rpartition(".")
        return {f"{module}.weight_scale"} if param == "weight" and module in self.scaled else set()

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for name, tensor in tensors.items():
            module, _, param = name.rpartition(".")
            if param == "weight_scale":
                continue
            if param == "weight" and module in self.scaled:
                scale = tensors[f"{module}.weight_scale"].float()
                scale = scale.reshape(-1, 1) if scale.numel() == tensor.shape[0] and scale.numel() > 1 else \
                    scale.reshape(())
                tensor = (tensor.float() * scale).to(self.dtype)
            out[name] = tensor
        return out


class Fp8ToColumns:
    """`quant_method: fp8` weights kept as float8 for QuantLinear's fp8 form: `qweight`, the e4m3 bytes K-major
    [in, out], and `scales` [in / block, out] float32 — a block's `weight_scale_inv` repeated along its output
    columns, or per channel / per tensor (`weight_scale`) the same row for every 128 inputs — so fused parts and
    tensor-parallel shards cut along outputs and inputs as GPTQ's columns do."""

    def __init__(self, names: set[str], block: list[int] | None) -> None:
        self.scale_of = {name.rpartition(".")[0]: name for name in names
                         if name.endswith((".weight_scale_inv", ".weight_scale"))}
        self.block = block

    def get_dependencies(self, weight_name: str) -> set[str]:
        module, _, param = weight_name.rpartition(".")
        return {self.scale_of[module]} if param == "weight" and module in self.scale_of else set()

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        module = next(name for name in tensors if name.endswith(".weight")).removesuffix(".weight")
        weight, scale = tensors[f"{module}.weight"], tensors[self.scale_of[module]].float()
        outputs = weight.shape[0]
        if self.block:  # [out / block_n, in / block_k] → [in / block_k, out]
            columns = scale.t().repeat_interleave(self.block[0], dim=1)[:, :outputs]
        else:  # one row per 128 inputs all the same, so row-parallel shards cut it as they cut blocks
            row = scale.reshape(1, -1).expand(1, outputs) if scale.numel() == 1 else scale.reshape(1, outputs)
            columns = row.expand(-(-weight.shape[1] // FP8_CHANNEL_ROWS), outputs)
        return {f"{module}.qweight": weight.view(torch.uint8).t().contiguous(),
                f"{module}.scales": columns.contiguous()}


class PackedToGptq:
    """compressed-tensors `pack-quantized` 4-bit weights → GPTQ v1 tensors (qweight, qzeros, scales, g_idx); with
    `experts_as_codes`, a mixture of experts' routed experts → the codes, scales and offsets of the CPU int4 kernel
    (llmctl.engine.layers.coded_experts), as ExpertsToCodes makes them of GPTQ experts."""

    def __init__(self, details: dict[str, Any], experts_as_codes: bool = False,
                 others_into: torch.dtype | None = None) -> None:
        """`others_into`: every weight but the coded experts dequantized into this dtype (DeepSeek: MLA's layers
        take no packed weights)."""
        self.config = _config(details)
        self.experts_as_codes, self.others_into = experts_as_codes, others_into

    def get_dependencies(self, weight_name: str) -> set[str]:
        module, _, param = weight_name.rpartition(".")
        if param != "weight_packed":
            return set()
        names = {f"{module}.weight_scale", f"{module}.weight_shape"}
        return names | ({f"{module}.weight_zero_point"} if not self._weights().symmetric else set())

    def _weights(self) -> Any:
        return next(iter(self.config.config_groups.values())).weights  # kept_as_gptq: every group agrees

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

        args = self._weights()
        module = next(name for name in tensors if name.endswith(".weight_packed")).rpartition(".")[0]
        shape = torch.Size(tensors[f"{module}.weight_shape"].tolist())
        signed = unpack_from_int32(tensors[f"{module}.weight_packed"], args.num_bits, shape)
        offset = 1 << (args.num_bits - 1)  # the library's int8 values are signed: GPTQ stores them unsigned
        scales = tensors[f"{module}.weight_scale"].float()  # [out, groups]; [out, 1] per channel
        if args.symmetric:
            zeros = torch.full(scales.shape, offset, dtype=torch.int32)
        else:
            zeros = unpack_from_int32(tensors[f"{module}.weight_zero_point"], args.num_bits, scales.shape,
                                      packed_dim=0).to(torch.int32) + offset
        group = args.group_size if args.group_size else shape[1]
        weight = QuantizedWeight((signed.to(torch.int32) + offset), scales, zeros, args.num_bits, group)
        if self.experts_as_codes and ".experts." in module and group % 32 == 0 and shape[1] % 32 == 0:
            return expert_codes(module, weight)
        if self.others_into is not None:
            return {f"{module}.weight": weight.dequantize().to(self.others_into)}
        return {f"{module}.{kind}": tensor for kind, tensor in pack_gptq(weight).items()}


class Int8ToCodes:
    """compressed-tensors symmetric 8-bit integer weights (pack- or int-quantized) → int8 codes with a float32
    scale per group of 32 (16) inputs, the channel's scale repeated: what CodedLinear's int8 kernel reads."""

    def __init__(self, details: dict[str, Any], fmt: str) -> None:
        self.weights = next(iter(_config(details).config_groups.values())).weights
        self.root = "weight_packed" if fmt == "pack-quantized" else "weight"

    def get_dependencies(self, weight_name: str) -> set[str]:
        module, _, param = weight_name.rpartition(".")
        if param != self.root:
            return set()
        return {f"{module}.weight_scale"} | ({f"{module}.weight_shape"} if self.root == "weight_packed" else set())

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

        module = next(name for name in tensors if name.endswith(f".{self.root}")).rpartition(".")[0]
        codes = tensors[f"{module}.{self.root}"]
        if self.root == "weight_packed":
            codes = unpack_from_int32(codes, 8, torch.Size(tensors[f"{module}.weight_shape"].tolist()))
        scales = tensors[f"{module}.weight_scale"].float()  # [out, groups]; [out, 1] per channel
        inputs = codes.shape[1]
        group = self.weights.group_size or (32 if inputs % 32 == 0 else 16)  # per channel: split for TP ranks
        scales = scales.repeat_interleave(inputs // group // scales.shape[1], dim=1)
        return {f"{module}.codes": codes.to(torch.int8).contiguous(), f"{module}.scales": scales.contiguous(),
                f"{module}.offsets": torch.zeros_like(scales)}


class ExpertsDequantizer:
    """A GPTQ or AWQ mixture-of-experts checkpoint's routed experts, dequantized into `weight` tensors for the
    engine's stacked experts (which run dense); attention and shared experts stay packed (QuantLinear) — or, with
    `everything` (DeepSeek, whose MLA layers take no packed weights), every packed weight dequantized."""

    PACKED = ("qweight", "qzeros", "scales", "g_idx")

    def __init__(self, quant: QuantizationSpec, names: set[str], dtype: torch.dtype, everything: bool = False) -> None:
        self.method, self.bits, self.names, self.dtype = quant.method, quant.bits or 4, names, dtype
        self.group_size = quant.group_size if quant.group_size and quant.group_size > 0 else 0
        self.everything = everything

    def _taken(self, module: str) -> bool:
        return self.everything or ".experts." in module

    def is_companion(self, name: str) -> bool:
        module, _, kind = name.rpartition(".")
        return self._taken(module) and kind in self.PACKED[1:]

    def get_dependencies(self, weight_name: str) -> set[str]:
        module, _, kind = weight_name.rpartition(".")
        if kind != "qweight" or not self._taken(module):
            return set()
        return {f"{module}.{part}" for part in self.PACKED[1:] if f"{module}.{part}" in self.names}

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        module, weight = self._unpacked(tensors)
        return {f"{module}.weight": weight.dequantize().to(self.dtype)}

    def _unpacked(self, tensors: dict[str, torch.Tensor]) -> tuple[str, QuantizedWeight]:
        """The module's name and its integer weight, unpacked by the formats module."""
        module = next(name for name in tensors if name.endswith(".qweight")).removesuffix(".qweight")
        packed = {kind: tensors[f"{module}.{kind}"] for kind in self.PACKED if f"{module}.{kind}" in tensors}
        inputs = packed["qweight"].shape[0] * (32 // self.bits) if self.method == "gptq" else packed["qweight"].shape[0]
        group = self.group_size or inputs  # per channel: one group of every input
        return module, unpack_gptq(packed, self.bits, group) if self.method == "gptq" else unpack_awq(packed, group)


class ExpertsToCodes(ExpertsDequantizer):
    """The routed experts kept as 4-bit codes for the CPU int4 kernel (llmctl.engine.layers.coded_experts): `codes`
    (packed as GGUF's coded form stores them), and per group `scales` and `offsets` (w = code · scale + offset). An
    expert the kernel cannot take as it is (act-order GPTQ, groups or inputs not a multiple of 32), and with
    `everything` any other packed weight, is dequantized, as above."""

    def process(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        module, weight = self._unpacked(tensors)
        if ".experts." not in module or weight.g_idx is not None or weight.group_size % 32 or weight.q.shape[1] % 32:
            return {f"{module}.weight": weight.dequantize().to(self.dtype)}
        return expert_codes(module, weight)


def expert_codes(module: str, weight: QuantizedWeight) -> dict[str, torch.Tensor]:
    """A 4-bit expert as the CPU int4 kernel reads it: codes packed as GGUF's coded form stores them, and per group
    `scales` and `offsets` (w = code · scale + offset)."""
    scales = weight.scales.float()
    codes = GroupCodes(weight.q.to(torch.uint8).numpy(), scales.numpy(), scales.numpy(), 4).stored_codes()
    return {f"{module}.codes": torch.from_numpy(codes), f"{module}.scales": scales,
            f"{module}.offsets": -weight.zeros.float() * scales}


def _config(details: dict[str, Any]) -> Any:
    from compressed_tensors.quantization import QuantizationConfig

    return QuantizationConfig.model_validate({"quant_method": "compressed-tensors", **details})


def converter_for(folder: Path, quant: QuantizationSpec | None, form: QuantizationSpec | None, names: set[str],
                  dtype: torch.dtype, moe: bool = False) -> tuple[Converter | None, str]:
    """The converter a checkpoint's quantized tensors go through on their way to layers built for `form`
    (llmctl.engine.models.registry.layer_form; None: dense), and what it does, for the log (None: read as they
    are). `names`: every tensor name in the checkpoint."""
    if quant is not None and quant.method in ("gptq", "awq") and moe:
        return _experts_converter(quant, form, names, dtype)
    if quant is not None and quant.method == "mxfp4" and form is not None:
        return None, "gpt-oss's MXFP4 experts kept as MXFP4 (4.25 bits a weight) for the fused-MoE kernel"
    if quant is not None and quant.method == "mxfp4":
        from llmctl.checkpoint.mxfp4 import Mxfp4ExpertsDequantizer

        return Mxfp4ExpertsDequantizer(names, dtype), (f"gpt-oss's MXFP4 experts dequantized once at load into "
                                                       f"{str(dtype).removeprefix('torch.')}")
    if quant is None or quant.method not in ("fp8", "compressed-tensors"):
        return None, ""  # read as stored (GPTQ, AWQ, GGUF), or refused by name (llmctl.engine.models.registry)
    try:
        return _converter(folder, quant, form, names, dtype, moe)
    except ValueError as exc:  # pydantic's ValidationError included: the library could not read the config
        raise CorruptModelError(f"{folder.name}: compressed-tensors cannot read its quantization_config: "
                                f"{str(exc).splitlines()[0]}") from None


def _experts_converter(quant: QuantizationSpec, form: QuantizationSpec | None, names: set[str],
                       dtype: torch.dtype) -> tuple[Converter, str]:
    """A GPTQ/AWQ mixture of experts: its routed experts coded (CPUs, whole experts per rank) or dequantized; the
    rest kept packed where the layers take packed weights (form GPTQ/AWQ), else dequantized too (DeepSeek)."""
    method, into = quant.method.upper(), str(dtype).removeprefix("torch.")
    everything = form is None or form.method not in ("gptq", "awq")
    rest = f"the other weights dequantized too (MLA's layers take no {method} weights)" if everything else \
        "attention and shared experts stay packed"
    if form is not None and form.details.get("experts") == "codes":
        return ExpertsToCodes(quant, names, dtype, everything), \
            f"{method} experts kept 4-bit for the CPU int4 kernel; {rest}"
    return ExpertsDequantizer(quant, names, dtype, everything), \
        f"{method} experts dequantized once at load into {into} (llmctl's fused MoE runs dense experts); {rest}"


def _converter(folder: Path, quant: QuantizationSpec, form: QuantizationSpec | None, names: set[str],
               dtype: torch.dtype, moe: bool = False) -> tuple[Converter, str]:
    into = str(dtype).removeprefix("torch.")
    if quant.method == "fp8" and form is not None and form.method == "fp8":
        return Fp8ToColumns(names, quant.details.get("weight_block_size")), (
            "fp8 weights kept as float8 (a byte each) for llmctl's FP8 W8A16 GEMM; activations run unquantized, "
            "as in the dequantized form (the checkpoint's dynamic fp8 activations are not applied)")
    if quant.method == "fp8":
        block = quant.details.get("weight_block_size")
        what = f"fp8 weights dequantized once at load into {into} (FP8 GEMMs are not built yet)"
        if block:
            from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer

            return FP8BlockDequantizer.from_pretrained(str(folder), weight_block_size=tuple(block), dtype=dtype), what
        return Fp8ScaleDequantizer(names, dtype), what
    if form is not None and form.method == "dequantized" and form.details.get("from") == "compressed-tensors":
        return PackedToGptq(quant.details, True, dtype), (
            f"compressed-tensors 4-bit routed experts kept as codes for the CPU int4 kernel; the other weights "
            f"dequantized once at load into {into} (MLA's layers take no packed weights)")
    if form is not None and form.method == "gptq":
        experts = form.details.get("experts") == "codes"
        return PackedToGptq(quant.details, experts), \
            "compressed-tensors 4-bit weights kept quantized (run as GPTQ on llmctl's int4 kernels" + \
            ("; the routed experts as codes for the CPU int4 kernel)" if experts else ")")
    if form is not None and form.method == "int8-codes":
        activations = " (activations quantized per token first, as the scheme says)" \
            if form.details.get("input_activations") else ""
        return Int8ToCodes(quant.details, compressed_format(quant.details)), \
            f"compressed-tensors 8-bit weights kept as int8 codes for llmctl's int8 CPU kernel{activations}"
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer

    activations = "activations run unquantized"
    if form is not None and form.method == "dynamic-activations":
        activations = "activations quantized per token as the scheme says" + (", the experts' too" if moe else "")
    return CompressedTensorsDequantizer(str(folder), dtype=dtype), (
        f"compressed-tensors weights dequantized once at load into {into} by compressed-tensors (no llmctl kernel "
        f"for this scheme yet; {activations})")
