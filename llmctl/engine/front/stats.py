"""EngineStats: one consistent read of an engine's counters and queues, for /metrics and the
periodic stats line (the server never reads the scheduler or the block manager itself)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.engine.core.host_tier import HostTier
from llmctl.engine.core.scheduler import Scheduler
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.spec_decode.stats import SpecDecodeStats


@dataclass(frozen=True)
class SpecDecodeCounts:
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class OffloadCounts:
    """The KV cache's CPU tier (--kv-offloading-size): vLLM's external prefix cache counters, and bytes moved."""
    queries: int  # prompt tokens asked of the tier (those the device pool did not hold)
    hits: int  # of those, loaded from it
    store_bytes: int  # device -> CPU
    load_bytes: int  # CPU -> device


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
    offload: OffloadCounts | None = None  # None: no CPU tier


def snapshot(scheduler: Scheduler, spec: SpecDecodeStats | None, max_loras: int) -> EngineStats:
    blocks = scheduler.block_manager
    running, waiting = tuple(scheduler.running), tuple(scheduler.waiting)  # one copy each, in C
    return EngineStats(
        num_running=len(running), num_waiting=len(waiting), kv_cache_usage=blocks.usage,
        prefix_cache_queries=blocks.stats.queries, prefix_cache_hits=blocks.stats.hits,
        num_preemptions=scheduler.num_preemptions, prompt_tokens=scheduler.counts.prompt_tokens,
        generation_tokens=scheduler.counts.generation_tokens, max_loras=max_loras,
        running_adapters=_adapter_names(running), waiting_adapters=_adapter_names(waiting),
        spec_decode=None if spec is None else SpecDecodeCounts(
            spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens, list(spec.accepted_per_position)),
        offload=_offload_counts(blocks.host))


def _offload_counts(host: HostTier | None) -> OffloadCounts | None:
    if host is None:
        return None
    stats = host.stats
    return OffloadCounts(stats.queries, stats.hits, stats.blocks_stored * host.block_bytes,
                         stats.blocks_loaded * host.block_bytes)


def _adapter_names(seqs: tuple[Sequence, ...]) -> tuple[str, ...]:
    return tuple(sorted({s.lora.name for s in seqs if s.lora is not None}))
