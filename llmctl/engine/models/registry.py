"""Architecture dispatch from config.json's `architectures` (the model classes are imported only when built)."""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.quant_schemes import kept_as_gptq, layer_quantization, unread_problem
from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import UnsupportedModelError

if TYPE_CHECKING:  # torch-free at import: inspect and plan ask which implementation serves a model
    from torch import nn

    from llmctl.engine.models.common import Shard

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",  # QK-norm, read from the config (ModelSpec.attention.qk_norm)
    "GraniteForCausalLM": "llama",  # Llama with four multipliers (llama.Multipliers)
    "QWenLMHeadModel": "llama",  # Qwen (1): Llama-shaped under other names; its remote code is never run
    "MixtralForCausalLM": "moe",  # Llama attention, routed experts (llmctl.engine.layers.moe)
    "Qwen2MoeForCausalLM": "moe",  # Qwen2 attention, routed experts and a gated shared expert
    "Qwen3MoeForCausalLM": "moe",  # Qwen3 attention (QK-norm), routed experts
    "DeepseekV2ForCausalLM": "deepseek",  # multi-head latent attention, routed + shared experts
    "DeepseekV3ForCausalLM": "deepseek",  # as V2, with sigmoid routing and its correction bias
    "Glm4MoeForCausalLM": "glm4_moe",  # GLM-4.5/4.6: Llama attention (QK-norm, partial rotary), DeepSeek-V3 experts
    "GptOssForCausalLM": "gpt_oss",  # sinks, sliding/full layers, biased experts with a clamped SwiGLU
    "Llama4ForCausalLM": "llama4",  # chunked attention, NoPE layers with temperature tuning, interleaved MoE
    "Llama4ForConditionalGeneration": "llama4",  # Scout / Maverick as published: the language model, text-only
    "Mamba2ForCausalLM": "mamba2",  # no attention: a Mamba2 mixer per layer, a state per sequence
    "MambaForCausalLM": "mamba2",  # the same with Mamba (1)'s selective scan
    "FalconMambaForCausalLM": "mamba2",  # Mamba (1) with dt, B and C normed
    "Qwen3NextForCausalLM": "qwen3_next",  # gated DeltaNet and gated attention, Qwen2-MoE experts
    "Qwen3_5ForCausalLM": "qwen3_next",  # Qwen3.5: Qwen3-Next's layers, the DeltaNet's projections apart, a dense MLP
    "Qwen3_5MoeForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_next",  # as published: the language model, text-only
    "Qwen3_5MoeForConditionalGeneration": "qwen3_next",
    "GraniteMoeHybridForCausalLM": "granite_hybrid",  # Granite 4.0-H: Mamba2 and NoPE attention, shared MLP + experts
    "JambaForCausalLM": "jamba",  # Mamba (1) layers around NoPE attention, SwiGLU or Mixtral-style experts
    "FalconH1ForCausalLM": "falcon_h1",  # a Mamba2 mixer beside Llama's attention in every layer, µP multipliers
    "NemotronHForCausalLM": "nemotron_h",  # one block per layer: Mamba2, NoPE attention, ReLU² MLP or ReLU² experts
    "Olmo2ForCausalLM": "olmo2",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma",
    "Gemma3ForCausalLM": "gemma",
    "Gemma3ForConditionalGeneration": "gemma3_vision",  # SigLIP, pooled and projected; images attend both ways
    "BloomForCausalLM": "bloom",
    "OPTForCausalLM": "opt",
    "LlavaForConditionalGeneration": "llava",  # CLIP tower + projector + a Llama-family language model
    "LlavaNextForConditionalGeneration": "llava_next",  # LLaVA on a base view and any-res tiles, row newlines
    "Idefics3ForConditionalGeneration": "idefics3",  # SmolVLM: SigLIP tiles, pixel shuffle, a Llama-family LM
    "Qwen2VLForConditionalGeneration": "qwen2_vl",  # dynamic-resolution ViT, M-RoPE Qwen2 language model
    "Qwen3VLForConditionalGeneration": "qwen3_vl",  # learned positions, DeepStack, interleaved M-RoPE, Qwen3 LM
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",  # as Qwen2-VL, its tower windowed, RMSNorm, gated MLP
}


NEMOTRON_BLOCK_KINDS = {"mamba", "attention", "mlp", "moe"}  # llmctl.engine.models.nemotron_h's blocks

# families whose own layers read no quantized checkpoint yet
NOT_QUANTIZED_YET = {"glm4_moe": "GLM-4.5", "llama4": "Llama 4", "mamba2": "Mamba / Mamba2", "granite_hybrid": "Granite 4.0-H",
                     "qwen3_next": "Qwen3-Next / Qwen3.5", "nemotron_h": "Nemotron-H",
                     "falcon_h1": "Falcon-H1", "jamba": "Jamba"}


def quantization_problem(spec: ModelSpec) -> str | None:
    """Why neither implementation serves the checkpoint's quantization format, or None."""
    return unread_problem(spec.quantization) if spec.quantization is not None else None


def is_supported(spec: ModelSpec) -> bool:
    return any(arch in SUPPORTED for arch in spec.architectures)


def implementation(spec: ModelSpec, requested: str = "auto") -> tuple[str | None, str]:
    """Which implementation `serve --model-impl requested` uses: "llmctl", "transformers" or None, and why not."""
    if problem := quantization_problem(spec):  # the fallback reads no other format either
        return None, problem
    problem = native_problem(spec)
    if requested in ("llmctl", "vllm"):
        return ("llmctl", "") if problem is None else (None, problem)
    if requested == "auto" and problem is None:
        return "llmctl", ""
    from llmctl.engine.models.transformers_impl import transformers_class

    cls, why = transformers_class(spec)
    if cls is not None:
        return "transformers", ""
    tried = "" if requested == "transformers" else f"{problem}; "
    return None, f"{tried}--model-impl transformers: {why}"


def native_problem(spec: ModelSpec) -> str | None:
    """Why llmctl's own implementation cannot serve this checkpoint, or None."""
    if not is_supported(spec):
        return _unsupported(spec)
    family = next(SUPPORTED[arch] for arch in spec.architectures if arch in SUPPORTED)
    method = spec.quantization.method if spec.quantization is not None else None
    if family == "gpt_oss" and method not in (None, "mxfp4"):
        return (f"a {method} gpt-oss checkpoint is not served by llmctl's own layers yet (its published MXFP4 one "
                "and bfloat16 ones are)")
    if family != "gpt_oss" and method == "mxfp4":
        return "quant_method mxfp4 is gpt-oss's own format: llmctl reads it for gpt-oss checkpoints only"
    if family in NOT_QUANTIZED_YET and method is not None:
        name = NOT_QUANTIZED_YET[family]
        return f"a {method} {name} checkpoint is not served by llmctl's own layers yet (its unquantized one is)"
    if family == "nemotron_h" and (unknown := sorted(set(spec.layout.blocks or ()) - NEMOTRON_BLOCK_KINDS)):
        return (f"Nemotron-H block kinds {', '.join(unknown)} are not ones llmctl runs (it runs "
                f"{', '.join(sorted(NEMOTRON_BLOCK_KINDS))})")
    if family == "deepseek" and method == "gguf":
        return ("GGUF DeepSeek files are not served yet: use the Hugging Face checkpoint, or an FP8, GPTQ, AWQ or "
                "compressed-tensors one")
    return None


def _unsupported(spec: ModelSpec) -> str:
    names = ", ".join(spec.architectures) or spec.model_type
    return f"llmctl's engine has no native {names}; native architectures: {', '.join(SUPPORTED)}"


def layer_form(spec: ModelSpec, device_type: str, impl: str = "auto", shard: Shard | None = None
               ) -> QuantizationSpec | None:
    """The form the layers hold a pre-quantized checkpoint's weights in on this device
    (llmctl.checkpoint.quant_schemes.layer_quantization): int8 codes only on CPUs, in llmctl's own Llama-family
    layers; 4-bit experts as codes only on CPUs, in its Mixtral/Qwen-MoE layers, where a rank holds whole
    experts (one tensor-parallel rank, no expert parallelism)."""
    return _layer_form(spec, device_type, implementation(spec, impl)[0], shard)


def _layer_form(spec: ModelSpec, device_type: str, chosen: str | None, shard: Shard | None
                ) -> QuantizationSpec | None:
    family = next((SUPPORTED[arch] for arch in spec.architectures if arch in SUPPORTED), None)
    own_cpu_layers = device_type == "cpu" and chosen == "llmctl"
    whole_experts = shard is None or (shard.group.size == 1 and shard.experts is None)
    quant = spec.quantization
    if own_cpu_layers and family == "moe" and quant is not None and quant.method == "gguf" and not whole_experts:
        raise UnsupportedModelError("a GGUF mixture of experts runs its experts as codes, whole on one rank, on CPUs: "
                                    "use --tp 1 without --enable-expert-parallel (--pp splits the layers instead)")
    if family == "gpt_oss" and quant is not None and quant.method == "mxfp4":  # only the experts are MXFP4
        return QuantizationSpec("mxfp4", 4, 32, dict(quant.details)) if keeps_mxfp4(device_type) else None
    packed = quant if quant is not None and quant.method in ("gptq", "awq") else kept_as_gptq(quant)
    if family == "deepseek" and packed is not None:
        # MLA's layers take no packed weights: all dequantized at load, the routed experts coded where they can be
        coded = own_cpu_layers and whole_experts and (packed.bits or 4) == 4
        origin = {"from": "compressed-tensors"} if packed.details.get("from") else {}
        return QuantizationSpec("dequantized", packed.bits, packed.group_size, {"experts": "codes", **origin}) \
            if coded else None
    return layer_quantization(spec.quantization, spec.moe is not None,
                              int8_codes=own_cpu_layers and family == "llama",
                              coded_experts=own_cpu_layers and family == "moe" and whole_experts,
                              fp8_kept=keeps_fp8(device_type) and chosen == "llmctl" and family == "llama")


def keeps_fp8(device_type: str) -> bool:
    """Whether fp8 weights stay float8 on this device: on GPUs, for the FP8 W8A16 Triton GEMM; CPUs have no FP8
    arithmetic and dequantize them once at load."""
    return device_type == "cuda"


def keeps_mxfp4(device_type: str) -> bool:
    """Whether gpt-oss's MXFP4 experts stay MXFP4 on this device: on GPUs, decoded in the fused-MoE kernel's
    registers; CPUs dequantize them once at load (llmctl.checkpoint.mxfp4)."""
    return device_type == "cuda"


def create_model(spec: ModelSpec, hf_config: Any, shard: Shard | None = None, impl: str = "auto",
                 device_type: str = "cpu") -> nn.Module:
    """The model for `spec`, its layers built for the form its weights load in on this device (layer_form)."""
    chosen, why = implementation(spec, impl)
    if chosen is None:
        raise UnsupportedModelError(why)
    layers = replace(spec, quantization=_layer_form(spec, device_type, chosen, shard))
    if chosen == "transformers":
        from llmctl.engine.models.transformers_impl import TransformersForCausalLM

        return TransformersForCausalLM(layers, hf_config, shard)
    return _native(layers, hf_config, shard)


# family -> (module, class): imported only when a model of that family is built
FAMILY_CLASSES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "moe": ("moe", "MixtureOfExpertsForCausalLM"),
    "deepseek": ("deepseek", "DeepseekForCausalLM"),
    "glm4_moe": ("glm4_moe", "Glm4MoeForCausalLM"),
    "gpt_oss": ("gpt_oss", "GptOssForCausalLM"),
    "llama4": ("llama4", "Llama4ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "gemma": ("gemma", "GemmaForCausalLM"),
    "olmo2": ("olmo2", "Olmo2ForCausalLM"),
    "mamba2": ("mamba2", "Mamba2ForCausalLM"),
    "granite_hybrid": ("granite_hybrid", "GraniteMoeHybridForCausalLM"),
    "nemotron_h": ("nemotron_h", "NemotronHForCausalLM"),
    "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM"),
    "jamba": ("jamba", "JambaForCausalLM"),
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM"),
    "bloom": ("bloom", "BloomForCausalLM"),
    "opt": ("opt", "OPTForCausalLM"),
    "gemma3_vision": ("gemma3_vision", "Gemma3ForConditionalGeneration"),
    "llava": ("llava", "LlavaForConditionalGeneration"),
    "llava_next": ("llava_next", "LlavaNextForConditionalGeneration"),
    "idefics3": ("idefics3", "Idefics3ForConditionalGeneration"),
    "qwen2_vl": ("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLForConditionalGeneration"),
}


def _native(spec: ModelSpec, hf_config: Any, shard: Shard | None) -> nn.Module:
    for arch in spec.architectures:
        if arch in SUPPORTED:
            module, name = FAMILY_CLASSES[SUPPORTED[arch]]
            return getattr(importlib.import_module(f"llmctl.engine.models.{module}"), name)(spec, hf_config, shard)
    raise UnsupportedModelError(_unsupported(spec))
