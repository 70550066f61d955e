"""Architecture dispatch from config.json's `architectures`."""

from __future__ import annotations

from typing import Any

from torch import nn

from llmctl.errors import UnsupportedModelError
from llmctl.model.spec import ModelSpec

SUPPORTED = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "BloomForCausalLM": "bloom",
    "OPTForCausalLM": "opt",
}


def create_model(spec: ModelSpec, hf_config: Any) -> nn.Module:
    for arch in spec.architectures:
        family = SUPPORTED.get(arch)
        if family == "llama":
            from llmctl.engine.models.llama import LlamaForCausalLM

            return LlamaForCausalLM(spec, hf_config)
        if family == "bloom":
            from llmctl.engine.models.bloom import BloomForCausalLM

            return BloomForCausalLM(spec, hf_config)
        if family == "opt":
            from llmctl.engine.models.opt import OPTForCausalLM

            return OPTForCausalLM(spec, hf_config)
    names = ", ".join(spec.architectures) or spec.model_type
    raise UnsupportedModelError(
        f"the engine does not support {names} yet; supported architectures: {', '.join(SUPPORTED)}")
