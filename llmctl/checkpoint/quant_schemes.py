"""What a pre-quantized checkpoint's `quantization_config` says, in words and in what the engine does with it.

Formats read (their files are decoded in llmctl.checkpoint.quant_converters):
- `fp8`: float8_e4m3fn weights with a scale per tensor or per output channel (`weight_scale`), or
  per block (`weight_block_size`, `weight_scale_inv`: DeepSeek-V3, the Qwen3 `-FP8` releases).
- `compressed-tensors` (llm-compressor's): config groups of weight (and activation) schemes, int or
  float, per tensor, channel, group or block, in `pack-quantized`, `int-quantized`,
  `float-quantized` or `naive-quantized` files.

Only this config is parsed here (no library import): enough to describe the scheme and to choose
between keeping 4-bit integer weights quantized (as GPTQ, on the int4 kernels) and dequantizing once at
load into the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmctl.checkpoint.architecture import QuantizationSpec

# the compressed-tensors formats whose files llmctl reads (the sparse 2:4 ones are not; NVFP4 and MXFP4
# weights are dequantized at load)
READ_FORMATS = ("pack-quantized", "int-quantized", "float-quantized", "naive-quantized", "mxfp4-pack-quantized",
                "nvfp4-pack-quantized")
FP8_CHANNEL_ROWS = 128  # inputs per scale row of a per-channel or per-tensor fp8 weight kept as float8 (Fp8ToColumns)
SERVED_METHODS = ("gptq", "awq", "gguf", "fp8", "compressed-tensors", "mxfp4")  # mxfp4: gpt-oss's own


@dataclass(frozen=True)
class GroupScheme:
    """One compressed-tensors config group: its weights' and input activations' quantization."""

    targets: tuple[str, ...]
    weight_type: str  # int | float
    bits: int
    strategy: str  # tensor | channel | group | block | tensor_group
    group_size: int | None
    symmetric: bool
    actorder: str | None
    activations: str | None  # e.g. "int8 per-token, dynamic"; None: weight-only

    def group_or_channel(self, multiple: int) -> int | None:
        """The weights' group size when it is a multiple of `multiple`, -1 per channel, else None."""
        if self.strategy == "channel":
            return -1
        grouped = self.strategy == "group" and isinstance(self.group_size, int) and self.group_size % multiple == 0
        return self.group_size if grouped else None

    def describe(self) -> str:
        weights = f"{self.weight_type}{self.bits} " + (
            f"group {self.group_size}" if self.strategy == "group" else
            f"group {self.group_size} under a global scale" if self.strategy == "tensor_group" else f"per-{self.strategy}")
        weights += "" if self.symmetric else " asymmetric"
        return f"W: {weights}; A: {self.activations or 'not quantized'}"


def group_schemes(details: dict[str, Any]) -> list[GroupScheme]:
    """The config groups of a compressed-tensors `quantization_config` (its details)."""
    groups = details.get("config_groups") or {}
    return [_group_scheme(group) for group in groups.values() if isinstance(group, dict)]


def _group_scheme(group: dict[str, Any]) -> GroupScheme:
    weights = group.get("weights") or {}
    inputs = group.get("input_activations")
    activations = None
    if isinstance(inputs, dict):
        how = "dynamic" if inputs.get("dynamic") else "static"
        activations = f"{inputs.get('type', 'int')}{inputs.get('num_bits', 8)} per-{inputs.get('strategy', 'tensor')}, " \
                      f"{how}"
    return GroupScheme(tuple(group.get("targets") or ()), str(weights.get("type", "int")),
                       int(weights.get("num_bits", 8)), str(weights.get("strategy", "tensor")),
                       weights.get("group_size"), bool(weights.get("symmetric", True)),
                       weights.get("actorder"), activations)


def compressed_format(details: dict[str, Any]) -> str:
    """The checkpoint's compressed-tensors format (the config's global one, else every group's own)."""
    formats = {str(group.get("format")) for group in (details.get("config_groups") or {}).values()
               if isinstance(group, dict) and group.get("format")}
    return str(details.get("format") or (formats.pop() if len(formats) == 1 else "mixed"))


def describe(quant: QuantizationSpec) -> str:
    """The scheme in a line (`inspect`, the startup log)."""
    if quant.method == "compressed-tensors":
        schemes = "; ".join(scheme.describe() for scheme in group_schemes(quant.details)) or "no config groups"
        return f"compressed-tensors {compressed_format(quant.details)} ({schemes})"
    if quant.method == "fp8":
        block = quant.details.get("weight_block_size")
        granularity = f"blocks of {block[0]}×{block[1]}" if block else "a scale per tensor or channel"
        return f"fp8 e4m3 weights, {granularity}; activations {quant.details.get('activation_scheme', 'dynamic')}"
    return quant.describe()


def unread_problem(quant: QuantizationSpec) -> str | None:
    """Why llmctl cannot read this checkpoint's quantized weights, or None."""
    supported = ("GPTQ, AWQ, GGUF, FP8 and compressed-tensors (pack-, int-, float- and naive-quantized) checkpoints, "
                 "and gpt-oss's MXFP4")
    if quant.method not in SERVED_METHODS:
        return (f"quantization_config.quant_method {quant.method!r} is not supported (llmctl serves {supported}): "
                "use the unquantized model, or `llmctl quantize MODEL --gptq|--awq`")
    if quant.method == "compressed-tensors":
        fmt = compressed_format(quant.details)
        if fmt not in READ_FORMATS:
            return (f"compressed-tensors format {fmt!r} is not read yet (llmctl reads {', '.join(READ_FORMATS)}): "
                    "use a checkpoint in one of those formats, or the unquantized model")
        if not group_schemes(quant.details):
            return "its compressed-tensors quantization_config has no config_groups: the checkpoint is incomplete"
    return None


def kept_as_gptq(quant: QuantizationSpec | None, moe: bool = False) -> QuantizationSpec | None:
    """The GPTQ form a compressed-tensors checkpoint runs in when every group is 4-bit integer weights only
    (group sizes a multiple of 32, or per channel) and all groups agree; None: it is dequantized at load."""
    scheme = None if moe else _uniform(quant, ("pack-quantized",))
    group = scheme.group_or_channel(32) if scheme is not None else None
    if scheme is None or group is None or (scheme.weight_type, scheme.bits) != ("int", 4) \
            or scheme.activations is not None or permuted_groups(scheme.actorder):
        return None
    return QuantizationSpec("gptq", 4, group, {"from": "compressed-tensors"})


def permuted_groups(actorder: str | None) -> bool:
    """Whether compressed-tensors' activation ordering changed the stored layout: "group" (and the deprecated
    "dynamic") store a weight_g_idx; "weight" (and its alias "static", llm-compressor's default for GPTQ) only
    changed the order GPTQ visited the columns in, and the groups stay contiguous."""
    return actorder in ("group", "dynamic")


def _uniform(quant: QuantizationSpec | None, formats: tuple[str, ...]) -> GroupScheme | None:
    """The one scheme of a compressed-tensors checkpoint in one of `formats` whose config groups all quantize the
    same way (their targets aside), else None."""
    if quant is None or quant.method != "compressed-tensors" or compressed_format(quant.details) not in formats:
        return None
    schemes = [replace(scheme, targets=()) for scheme in group_schemes(quant.details)]
    return schemes[0] if schemes and all(scheme == schemes[0] for scheme in schemes) else None


def dynamic_activations(quant: QuantizationSpec) -> dict[str, Any] | None:
    """The input-activation args every config group shares when they are dynamic (W8A8, FP8-dynamic), else None."""
    groups = [group for group in (quant.details.get("config_groups") or {}).values() if isinstance(group, dict)]
    inputs: list[Any] = [group.get("input_activations") for group in groups]
    if not inputs or not all(isinstance(args, dict) and args.get("dynamic") is True for args in inputs) \
            or any(args != inputs[0] for args in inputs):
        return None
    return dict(inputs[0])


def kept_as_int8(quant: QuantizationSpec | None) -> QuantizationSpec | None:
    """The int8-code form a compressed-tensors checkpoint runs in on CPUs when every group is symmetric 8-bit
    integer weights per channel or in groups of a multiple of 16, with no activation scheme or a dynamic one;
    None otherwise. Its details keep the dynamic activation args (W8A8) for the layer."""
    scheme = _uniform(quant, ("pack-quantized", "int-quantized"))
    group = scheme.group_or_channel(16) if scheme is not None else None
    if quant is None or scheme is None or group is None or (scheme.weight_type, scheme.bits) != ("int", 8) \
            or not scheme.symmetric or permuted_groups(scheme.actorder):
        return None
    activations = dynamic_activations(quant)
    if scheme.activations is not None and activations is None:
        return None
    return QuantizationSpec("int8-codes", 8, group, {"input_activations": activations} if activations else {})


def layer_quantization(quant: QuantizationSpec | None, moe: bool = False, int8_codes: bool = False,
                       coded_experts: bool = False, fp8_kept: bool = False) -> QuantizationSpec | None:
    """The quantization the engine's layers are built for: GPTQ/AWQ/GGUF as they are (a 4-bit GPTQ/AWQ, GGUF or
    compressed-tensors 4-bit weight-only mixture of experts' routed experts as codes where `coded_experts`: CPUs,
    whole experts per rank; details {"experts": "codes"}), compressed-tensors 4-bit weight-only as GPTQ (dense
    models), `quant_method: fp8` as float8 where `fp8_kept` (GPUs, the Llama family's layers), 8-bit integer
    weights as int8 codes
    where `int8_codes` (CPUs, the Llama family's layers), dynamic activation schemes otherwise as dense layers
    that quantize their inputs ("dynamic-activations"), everything else dense (dequantized once at load: None)."""
    if quant is not None and moe and coded_experts and (quant.method == "gguf" or (
            quant.method in ("gptq", "awq") and (quant.bits or 4) == 4)):
        return replace(quant, details={**quant.details, "experts": "codes"})
    if quant is None or quant.method in ("gptq", "awq", "gguf"):
        return quant
    if fp8_kept and not moe and quant.method == "fp8":  # GPUs, Llama-family layers: the FP8 W8A16 GEMM
        block = quant.details.get("weight_block_size")
        return QuantizationSpec("fp8", 8, int(block[1]) if block else FP8_CHANNEL_ROWS, dict(quant.details))
    if moe and coded_experts and (packed := kept_as_gptq(quant)) is not None:  # compressed-tensors W4A16 experts
        return replace(packed, details={**packed.details, "experts": "codes"})
    if int8_codes and not moe and (codes := kept_as_int8(quant)) is not None:
        return codes
    if quant.method == "compressed-tensors" and (activations := dynamic_activations(quant)) is not None:
        return QuantizationSpec("dynamic-activations", details={"input_activations": activations})
    return kept_as_gptq(quant, moe)


def sizing_quantization(quant: QuantizationSpec | None) -> QuantizationSpec | None:
    """The checkpoint's weights as `plan` sizes them (vLLM holds them as stored): GPTQ, AWQ, FP8 and gpt-oss's
    MXFP4 (its experts) as they are,
    compressed-tensors as the GPTQ-like int4/int8 or the fp8 they store; None for what plan sizes at 16 bits."""
    if quant is None or quant.method in ("gptq", "awq", "fp8", "mxfp4"):
        return quant
    if quant.method != "compressed-tensors":
        return None
    schemes = group_schemes(quant.details)
    kinds = {(s.weight_type, s.bits, s.strategy, s.group_size) for s in schemes}
    if len(kinds) != 1:
        return None
    kind, bits, strategy, group_size = kinds.pop()
    if kind == "int" and bits == 4:
        return QuantizationSpec("gptq", 4, group_size if strategy == "group" else -1)
    if kind == "int" and bits == 8:
        return QuantizationSpec("int8", 8)
    if kind == "float" and bits == 8:
        block = schemes[0].strategy == "block"
        return QuantizationSpec("fp8", 8, details={"weight_block_size": [128, 128]} if block else {})
    return None


def served_form(quant: QuantizationSpec, dtype: str, moe: bool = False, mla: bool = False) -> str:
    """Where `llmctl serve` keeps a pre-quantized checkpoint's weights on GPUs (plan's note)."""
    if quant.method in ("gptq", "awq") and mla:
        return (f"llmctl serve dequantizes these {quant.method.upper()} weights once at load into {dtype} (its MLA "
                "layers take no packed weights): they take the dense bytes")
    if quant.method in ("gptq", "awq") and moe:
        return (f"llmctl serve keeps attention and shared experts in {quant.method.upper()} and dequantizes the "
                f"routed experts once at load into {dtype}: its experts take the dense bytes")
    if quant.method in ("gptq", "awq"):
        return f"llmctl serve keeps the {quant.method.upper()} weights quantized"
    if kept_as_gptq(quant, moe) is not None:
        return "llmctl serve keeps these 4-bit weights quantized (as GPTQ, on its int4 kernels)"
    if quant.method == "fp8" and not moe and not mla:
        return ("llmctl serve keeps these fp8 weights as float8, a byte each, in its Llama-family layers (Llama, "
                "Mistral, Qwen2/3, Granite: its FP8 W8A16 Triton GEMM, activations unquantized); other families "
                f"dequantize them once at load into {dtype}")
    activations = " and quantizes activations per token in torch" if quant.method == "compressed-tensors" \
        and dynamic_activations(quant) is not None else ""
    return f"llmctl serve dequantizes these weights once at load into {dtype}{activations} (no kernel for the " \
           "scheme yet): its weights take the dense bytes"
