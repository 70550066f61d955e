"""GPU memory the draft model will take, set aside before the target sizes its KV pool.

The draft loads after the target; on a GPU the target's pool takes what `--gpu-memory-utilization`
leaves, so the draft would find nothing. The target therefore plans for the draft's weights and for
the draft's KV of each of its blocks (the draft keeps exactly the target's block tables), counted
by `llmctl plan`'s formulas from the draft's config alone."""

from __future__ import annotations

import torch

from llmctl.checkpoint.config_file import load_spec
from llmctl.checkpoint.source import resolve_model
from llmctl.engine.config import EngineConfig
from llmctl.engine.worker.memory_reservation import MemoryReservation
from llmctl.sizing.kv import stage_kv
from llmctl.sizing.weights import stage_weights, weight_format


def draft_reservation(config: EngineConfig, dtype: torch.dtype, kv_dtype: torch.dtype) -> MemoryReservation:
    spec_config = config.speculative
    if spec_config is None or spec_config.method != "draft_model":
        return MemoryReservation()
    spec = load_spec(resolve_model(spec_config.model, weights=False))
    element = torch.tensor([], dtype=dtype).element_size()
    own = spec.quantization.method if spec.quantization else None
    weights = stage_weights(spec, weight_format(element, own, spec), 1, 1)[0].total_bytes
    kv_element = torch.tensor([], dtype=kv_dtype).element_size()
    block = stage_kv(spec, 1, range(spec.num_layers), kv_element, config.block_size).block_bytes
    return MemoryReservation(f"draft model {spec_config.model}", weights, block)
