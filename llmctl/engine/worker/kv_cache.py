"""The KV cache of one process: how many bytes it may take (measured on GPUs after a profile
step, a fixed budget on CPUs), how many blocks that is (the plan module's accounting, so
`llmctl plan` predicts the same pool), the check that one full-length sequence fits, and
the allocation itself."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.config import EngineConfig, cpu_kv_cache_default
from llmctl.engine.errors import EngineConfigError
from llmctl.engine.layers.attention import AttentionBackend, KVCache
from llmctl.engine.layers.recurrent_state import StateCache, allocate_states
from llmctl.engine.worker.loaded_model import Placement
from llmctl.engine.worker.memory_reservation import MemoryReservation
from llmctl.engine.worker.profile import dummy_prefill, measure_activation_peak, run_dummy_step
from llmctl.kernels.huge_pages import zeros_on_huge_pages
from llmctl.settings import kv_cache_format
from llmctl.sizing.kv import StageKV, attention_layers, kv_groups, stage_kv
from llmctl.sizing.memory import KVPool, MemoryBudget, kv_pool, state_slots
from llmctl.sizing.weights import kv_heads_per_rank
from llmctl.units import GiB

logger = logging.getLogger("llmctl.engine")


@dataclass
class KVCacheSetup:
    geometry: StageKV
    pool: KVPool
    caches: dict[int, KVCache]  # by layer: the attention layers this process runs
    activation_peak_bytes: int  # measured on GPUs before sizing the pool; 0 elsewhere
    states: StateCache | None = None  # the recurrent layers' per-sequence states (Mamba2)


def set_up_kv_cache(config: EngineConfig, spec: ModelSpec, model: nn.Module, backend: AttentionBackend,
                    placement: Placement, device: torch.device, dtype: torch.dtype, resident_bytes: int,
                    max_model_len: int, max_batched: int,
                    reserved: MemoryReservation = MemoryReservation()) -> KVCacheSetup:
    """Size the pool from what is left after `resident_bytes` (weights, adapters), the activation peak
    and what `reserved` sets aside (a draft model), agree on it with the other ranks, check one full
    sequence fits, and allocate it."""
    shard, rank = placement.shard(spec), placement.rank
    layers = shard.stage_layers(spec.num_layers)
    cache_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
    geometry = stage_kv(spec, rank.tp, layers, torch.tensor([], dtype=cache_dtype).element_size(), config.block_size)
    kv_heads = kv_heads_per_rank(spec, rank.tp)

    def make_caches(blocks: int) -> dict[int, KVCache]:
        return allocate(spec, blocks, config.block_size, layers, kv_heads, cache_dtype, device)

    activation = 0
    if device.type == "cuda" and config.kv_cache_memory is None:
        batch, blocks = dummy_prefill(max_batched, max_model_len, config.block_size)
        activation = measure_activation_peak(device, lambda: make_caches(blocks), lambda caches: run_dummy_step(
            model, caches, backend, batch, config.block_size, device, spec.hidden_size, shard.is_first,
            shard.is_last, sampler_rows=config.max_num_seqs))
    available = _kv_memory(config, device, resident_bytes, activation, max_batched)
    states = _allocate_states(config, spec, layers, dtype, device, placement, available,
                              geometry.sequence_bytes(max_model_len, max_batched))
    if states is not None:  # the state slots come out of the same budget, before the KV pool
        available -= states.nbytes
    if device.type == "cuda" and config.kv_cache_memory is None and reserved.what:
        share = reserved.kv_bytes_beside(available, geometry.block_bytes)
        logger.info("KV cache %.2f GiB of %.2f GiB: the rest is kept for the %s (weights %.2f GiB, and its KV "
                    "of each block)", share / GiB, available / GiB, reserved.what, reserved.fixed_bytes / GiB)
        available = share
    pool = kv_pool(available, geometry) if geometry.block_bytes else _tables_only(config, max_model_len, geometry)
    agreed = placement.agree_on_blocks(pool.num_blocks)
    if agreed != pool.num_blocks:  # the KV pool is the smallest that every rank holds
        pool = kv_pool(agreed * geometry.block_bytes, geometry)
    _check_fits(config, device, geometry, pool, max_model_len, max_batched, available)
    return KVCacheSetup(geometry, pool, make_caches(pool.num_blocks), activation, states)


def _allocate_states(config: EngineConfig, spec: ModelSpec, layers: range, dtype: torch.dtype, device: torch.device,
                     placement: Placement, available: int, sequence_kv_bytes: int) -> StateCache | None:
    """A state slot for each of --max-num-seqs sequences, or as many as the budget holds (sizing.memory.state_slots;
    every stage agreeing)."""
    if spec.recurrent is None or spec.mixer is None:
        return None
    mine = [layer for layer in spec.recurrent.layers if layer in layers]
    per_sequence = len(mine) * spec.mixer.state_bytes(torch.tensor([], dtype=dtype).element_size(), placement.rank.tp)
    slots = placement.agree_on_blocks(state_slots(available, per_sequence, sequence_kv_bytes, config.max_num_seqs))
    if slots == 0:
        raise EngineConfigError(
            f"one sequence's recurrent state ({per_sequence / 2**20:.1f} MiB) and KV cache "
            f"({sequence_kv_bytes / 2**20:.1f} MiB at max_model_len) need more than the "
            f"{max(available, 0) / GiB:.2f} GiB available: give more memory (--kv-cache-memory-bytes, or "
            "--gpu-memory-utilization on GPUs) or a shorter --max-model-len")
    if slots < config.max_num_seqs:
        logger.info("recurrent state: %d sequences at once, not --max-num-seqs %d: the states may take the budget "
                    "less one max_model_len sequence's KV, at most half of it beside attention layers", slots,
                    config.max_num_seqs)
    return allocate_states(spec.mixer, mine, slots, dtype, device, placement.rank.tp)


def _tables_only(config: EngineConfig, max_model_len: int, geometry: StageKV) -> KVPool:
    """A model with no attention layer (Mamba2) keeps no K/V, but the scheduler still counts each sequence's
    tokens in blocks: as many empty blocks as --max-num-seqs sequences of max_model_len tokens take."""
    blocks = config.max_num_seqs * -(-max_model_len // geometry.block_size)
    return KVPool(available_bytes=0, num_blocks=blocks, block_size=geometry.block_size, bytes_per_block=0)


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """auto: the model's dtype; bfloat16/float16: K and V rounded to that as they are stored (half the
    bytes of a float32 model's cache, which a decode step reads whole); fp8: e4m3 with a scale of 1.0,
    as vLLM uses when a checkpoint carries no KV scales (values beyond ±448 are clamped); fp8_e5m2: e5m2,
    likewise (±57344, one mantissa bit fewer)."""
    stored = kv_cache_format(name).torch_name
    return model_dtype if stored is None else getattr(torch, stored)


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory as CUDA and torch's allocator report it."""

    free: int  # not held by any process
    total: int
    reserved: int  # held by this process's caching allocator
    allocated: int  # in live tensors of this process (every engine in it)

    @staticmethod
    def read(device: torch.device) -> DeviceMemory:
        free, total = torch.cuda.mem_get_info(device)
        return DeviceMemory(free, total, torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device))


ALLOCATION_HEADROOM = 256 * 2**20


def gpu_kv_bytes(memory: DeviceMemory, utilization: float, resident_bytes: int, activation_bytes: int,
                 step_tokens: int) -> int:
    """vLLM's budget: utilization × total − this engine's weights − its activation peak − memory outside
    torch's allocator; never more than can still be allocated beside the activation peak."""
    # this engine's own weights, not memory_allocated(): another engine in the process is not our weights
    budget = MemoryBudget(total_bytes=memory.total, utilization=utilization, weights_bytes=resident_bytes,
                          activation_bytes=activation_bytes,
                          overhead_bytes=max(0, memory.total - memory.free - memory.reserved))
    logger.info("KV budget %.2f GiB = %.2f × %.2f GiB total − %.2f GiB weights − %.2f GiB activation peak "
                "(measured at %d tokens) − %.2f GiB used outside this process's allocator", budget.kv_bytes / GiB,
                utilization, memory.total / GiB, budget.weights_bytes / GiB, activation_bytes / GiB,
                step_tokens, budget.overhead_bytes / GiB)
    # headroom: each layer's tensor is one allocation, and what is free may not hold the last one whole
    allocatable = memory.free + memory.reserved - memory.allocated - activation_bytes - ALLOCATION_HEADROOM
    if allocatable < budget.kv_bytes:
        logger.warning("KV cache capped at %.2f GiB: that is what the GPU has free beside the activation peak "
                       "(other tensors of this process, e.g. another engine, hold the rest)", allocatable / GiB)
    return min(budget.kv_bytes, allocatable)


def _kv_memory(config: EngineConfig, device: torch.device, resident_bytes: int, activation_bytes: int,
               step_tokens: int) -> int:
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    if device.type != "cuda":
        return cpu_kv_cache_default()
    return gpu_kv_bytes(DeviceMemory.read(device), config.gpu_memory_utilization, resident_bytes, activation_bytes,
                        step_tokens)


def _check_fits(config: EngineConfig, device: torch.device, geometry: StageKV, pool: KVPool, max_model_len: int,
                step_tokens: int, available: int) -> None:
    need = geometry.sequence_bytes(max_model_len, step_tokens)
    if pool.allocated_bytes >= need:
        return
    fits = geometry.max_length(pool.allocated_bytes, step_tokens)
    flag = "--kv-cache-memory-bytes" if config.kv_cache_memory is not None or device.type != "cuda" else \
        "--gpu-memory-utilization"
    hint = f"use --max-model-len {fits} or more memory ({flag})" if fits > 0 else f"give more memory ({flag})"
    raise EngineConfigError(
        f"max_model_len {max_model_len} needs {need / GiB:.2f} GiB of KV cache for one sequence; "
        f"{max(available, 0) / GiB:.2f} GiB is available: {hint}")


def token_shape(spec: ModelSpec, kv_heads: int) -> tuple[int, int, int]:
    """One token's slot: K and V of each KV head; MLA: one latent entry (kv_lora_rank + qk_rope_head_dim)."""
    att = spec.attention
    if att.kind == "MLA":
        return 1, 1, (att.kv_lora_rank or 0) + (att.qk_rope_head_dim or 0)
    return 2, kv_heads, att.head_dim


def allocate(spec: ModelSpec, num_blocks: int, block_size: int, layers: range | list[int], kv_heads: int,
             dtype: torch.dtype, device: torch.device) -> dict[int, KVCache]:
    """One tensor per slot of the KV groups (llmctl.sizing.kv.KVGroups): per layer where layers are of one kind;
    shared by the j-th layers of every group where sliding and full layers mix."""
    groups = kv_groups(spec)
    layers = [layer for layer in layers if layer in set(attention_layers(spec))]
    slots = sorted({groups.slot(layer) for layer in layers})
    if not slots:  # no attention layer here: nothing to hold
        return {}
    shape = (num_blocks, block_size, *token_shape(spec, kv_heads))
    if device.type == "cpu":  # one buffer on huge pages: decoding walks all of it every step
        pool = zeros_on_huge_pages((len(slots), *shape), dtype)
        tensors = {slot: pool[i] for i, slot in enumerate(slots)}
    else:
        tensors = {slot: torch.zeros(shape, dtype=dtype, device=device) for slot in slots}
    return {layer: KVCache(tensors[groups.slot(layer)]) for layer in layers}
