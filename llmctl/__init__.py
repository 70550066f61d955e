"""llmctl: from a Hugging Face checkpoint to a running, measured service."""

from __future__ import annotations

from typing import Any

from llmctl.version import __version__

__all__ = ["LLM", "LoRARequest", "PoolingParams", "SamplingParams", "__version__"]


def __getattr__(name: str) -> Any:
    # Imported lazily: `llmctl inspect` and `llmctl plan` never pay for torch.
    if name == "LLM":
        from llmctl.engine.front.llm import LLM

        return LLM
    if name == "SamplingParams":
        from llmctl.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "PoolingParams":
        from llmctl.engine.pooling.params import PoolingParams

        return PoolingParams
    if name == "LoRARequest":
        from llmctl.engine.lora.request import LoRARequest

        return LoRARequest
    raise AttributeError(f"module 'llmctl' has no attribute {name!r}")
