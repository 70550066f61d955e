"""LoRARequest: which adapter a request runs with, as vLLM's `vllm.lora.request.LoRARequest`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A human-readable name, an id unique per adapter (≥ 1), and a folder or hub id."""

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None
