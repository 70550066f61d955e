"""LoadedModel: what one process holds after startup (model, tokenizer, KV pool and caches),
and Placement: which part of the model that process loads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import Rank, TPGroup
from llmctl.engine.layers.attention import AttentionBackend, KVCache
from llmctl.engine.layers.recurrent_state import StateCache
from llmctl.engine.lora.slots import LoRASlots, LoRAStep
from llmctl.engine.models.common import Shard
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.worker.kv_offload import HostKVPool
from llmctl.sizing.kv import KVGroups, StageKV, kv_groups
from llmctl.sizing.memory import KVPool
from llmctl.sizing.weights import pipeline_stages


@dataclass
class LoadedModel:
    source: ModelSource
    spec: ModelSpec
    hf_config: Any
    model: nn.Module
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    backend: AttentionBackend
    kv_geometry: StageKV
    kv_pool: KVPool
    kv_caches: dict[int, KVCache]  # by layer: the layers this process runs
    max_model_len: int
    max_num_batched_tokens: int
    eos_token_ids: list[int]
    generation_defaults: dict[str, Any]
    weights_bytes: int
    placement: Placement = field(default_factory=lambda: Placement())
    attention_reason: str = ""  # why this backend (inspect says the same)
    activation_peak_bytes: int = 0  # measured on GPUs before sizing the KV pool (llmctl.engine.worker.profile)
    packed_bytes: int = 0  # packed copies of the CPU linears' weights (llmctl.engine.layers.cpu_gemm)
    lora_step: LoRAStep | None = None  # --enable-lora: which tokens use which slot, set every step
    lora_slots: dict[tuple[int, str], LoRASlots] = field(default_factory=dict)  # (layer, module) -> slots
    pooler: PoolerConfig | None = None  # a pooling model (--runner pooling): what its last stage returns
    states: StateCache | None = None  # the recurrent layers' per-sequence states (Mamba2)
    host_kv: HostKVPool | None = None  # the KV cache's CPU tier (--kv-offloading-size)

    @property
    def lora_bytes(self) -> int:
        return sum(slots.nbytes for slots in self.lora_slots.values())

    @property
    def kv_groups(self) -> KVGroups:
        return kv_groups(self.spec)

    @property
    def sliding_window(self) -> int | None:
        """The window of a model whose every layer slides (Mistral); models that mix sliding and full
        layers give each KV group its own (kv_groups)."""
        groups = self.kv_groups
        return None if groups.hybrid else groups.windows[0]

    @property
    def kv_cache_bytes(self) -> int:
        """The KV tensors' bytes (layers of different KV groups share tensors)."""
        return sum({cache.kv.data_ptr(): cache.nbytes for cache in self.kv_caches.values()}.values())


def _same(blocks: int) -> int:
    return blocks


@dataclass(frozen=True)
class Placement:
    """Which part of the model this process loads, and how ranks agree on the KV pool."""

    rank: Rank = Rank(0)
    group: TPGroup = field(default_factory=TPGroup)
    agree_on_blocks: Callable[[int], int] = _same  # the minimum over all ranks
    experts: ExpertPlacement | None = None  # whole experts per rank (--enable-expert-parallel)

    def shard(self, spec: ModelSpec) -> Shard:
        layers = pipeline_stages(spec, self.rank.pp)[self.rank.pp_rank] if self.rank.pp > 1 else None
        return Shard(self.group, layers, self.rank.is_first_stage, self.rank.is_last_stage, self.experts)
