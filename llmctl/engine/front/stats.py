"""EngineStats: one consistent read of an engine's counters and queues, for /metrics and the
periodic stats line (the server never reads the scheduler or the block manager itself)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SpecDecodeCounts:
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    num_running: int  # sequences in model execution batches
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by sequences
    prefix_cache_queries: int  # prompt tokens looked up
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    max_loras: int = 0  # 0: LoRA is off
    running_adapters: tuple[str, ...] = ()
    waiting_adapters: tuple[str, ...] = ()
    spec_decode: SpecDecodeCounts | None = None  # None: no speculative decoding
