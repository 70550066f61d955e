"""Runs this process's part of the model on a StepBatch and returns the logits that matter."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from llmctl.engine.core.step_messages import StepBatch, StepLogits
from llmctl.engine.distributed.expert_exchange import ReplicaExchange
from llmctl.engine.layers.attention import AttentionBackend, AttentionMetadata, KVCache
from llmctl.engine.layers.grouped_attention import GroupedAttention
from llmctl.engine.layers.moe import FusedMoE
from llmctl.engine.layers.recurrent_state import StateCache, StateStep
from llmctl.engine.layers.triton_attention import TritonAttention
from llmctl.engine.lora.slots import NO_ADAPTER, LoRAStep
from llmctl.engine.models.common import StepContext
from llmctl.engine.multimodal.encoder_cache import EncoderCache
from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.pooler import pool
from llmctl.engine.worker.block_tables import BlockTableCopy
from llmctl.engine.worker.kv_offload import HostKVPool
from llmctl.kernels.transfer import to_device

if TYPE_CHECKING:
    from llmctl.engine.worker.cuda_graphs import StepGraphs
    from llmctl.engine.worker.loaded_model import LoadedModel


class ModelRunner:
    """Runs one process's model part: every layer (TP 1), or one pipeline stage's shard."""

    def __init__(self, model: nn.Module, kv_caches: dict[int, KVCache], backend: AttentionBackend,
                 block_size: int, device: torch.device, sliding_window: int | None = None,
                 lora_step: LoRAStep | None = None, pooler: PoolerConfig | None = None,
                 states: StateCache | None = None) -> None:
        self.model = model
        self.states = states  # recurrent layers' per-sequence states (Mamba2), or None
        self.pooler = pooler  # a pooling model: the last stage returns pooled outputs, no logits
        self.lora_step = lora_step
        self.sliding_window = sliding_window
        self.kv_caches = kv_caches
        self.backend = backend
        if isinstance(backend, GroupedAttention):
            backend.bind(kv_caches)
        self.block_size = block_size
        self.device = device
        self.graphs: StepGraphs | None = None  # captured uniform steps (llmctl.engine.worker.cuda_graphs)
        self.exchange: ReplicaExchange | None = None  # EP across data-parallel replicas
        self.host_kv: HostKVPool | None = None  # the KV cache's CPU tier (llmctl.engine.worker.kv_offload)
        backends = backend.backends if isinstance(backend, GroupedAttention) else [backend]
        on_device = all(isinstance(b, TritonAttention) for b in backends)  # the others read the host lists
        self.tables = BlockTableCopy(len(backends), device if on_device else None)
        # async scheduling: the step before's sampled tokens, still on the device; a batch's placeholders are
        # filled from them there (llmctl.engine.executor.overlap), so the host need not have them yet
        self.previous_tokens: torch.Tensor | None = None
        self.encoder_cache = EncoderCache(model, device) if getattr(model, "takes_images", False) else None

    @torch.inference_mode()
    def forward(self, batch: StepBatch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """This stage's layers on the batch: token ids in (first stage) or the previous stage's hidden states."""
        if self.exchange is not None:  # only steps the replicas run together exchange (not load-time ones)
            self.exchange.active = batch.exchange_experts
        self.tables.apply(batch)
        if batch.host_copies and self.host_kv is not None:  # before any step copy, graph or forward
            self.host_kv.apply(batch.host_copies)
        if self.encoder_cache is not None:
            self.encoder_cache.update(batch)
        plain = hidden is None and not batch.embedding_slices and not batch.mrope_positions \
            and not batch.both_ways_spans
        shape = self.graphs.shape_of(batch) if self.graphs is not None and plain else None
        if shape is not None:
            return self.graphs.run(batch, shape, self.tables, self._fill_placeholders)
        self._copy_blocks(batch.block_copies)
        device = self.device
        if isinstance(self.backend, GroupedAttention):
            self.backend.prepare_groups([self._metadata(batch, group, window)
                                         for group, window in enumerate(self.backend.windows)], device)
        else:
            self.backend.prepare(self._metadata(batch, 0, self.sliding_window), device)
        if self.lora_step is not None:
            self.lora_step.set(batch.lora_slots or [NO_ADAPTER] * len(batch.seq_lens), batch.query_start_loc, device)
        input_ids, positions = to_device([batch.input_ids, batch.positions], torch.long, device)  # one copy
        self._fill_placeholders(batch, input_ids)
        if batch.mrope_positions:  # M-RoPE with images: [3, T]
            positions = to_device(batch.mrope_positions, torch.long, device)
        lengths = sequence_lengths(batch, device) if getattr(self.model, "needs_lengths", False) else None
        embeds = deepstack = None
        if batch.embedding_slices and self.encoder_cache is not None and hidden is None:
            embeds, deepstack = self.encoder_cache.merge(batch, self.model.embed(input_ids))
        states = StateStep(self.states, batch.query_start_loc, batch.state_slots,
                           [length == end - start for length, start, end in
                            zip(batch.seq_lens, batch.query_start_loc, batch.query_start_loc[1:])],
                           device) if self.states is not None else None
        return self.model(input_ids, StepContext(positions, self.kv_caches, self.backend, lengths, embeds, deepstack,
                                                 states), hidden)

    def _fill_placeholders(self, batch: StepBatch, input_ids: torch.Tensor) -> None:
        """Async scheduling: each placeholder's token from the step before's samples, on the device."""
        if not batch.placeholders or self.previous_tokens is None:
            return  # none, or the step thread already wrote them into batch.input_ids on the host
        rows, sources = to_device([[row for row, _ in batch.placeholders], [source for _, source in batch.placeholders]],
                                  torch.long, self.device)
        input_ids[rows] = self.previous_tokens[sources]

    def _metadata(self, batch: StepBatch, group: int, window: int | None) -> AttentionMetadata:
        """The step as one KV group's layers see it (a profiling batch has the first group's tables only)."""
        slots, tables = batch.slot_mapping, batch.block_tables
        if 0 < group <= len(batch.group_slot_mappings):
            slots, tables = batch.group_slot_mappings[group - 1], batch.group_block_tables[group - 1]
        width = max((len(table) for table in tables), default=1)
        return AttentionMetadata(slot_mapping=to_device(slots, torch.long, self.device),
                                 query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens, block_tables=tables,
                                 block_size=self.block_size, sliding_window=window,
                                 device_block_tables=self.tables.gathered(group, width),
                                 both_ways_spans=batch.both_ways_spans)

    @torch.inference_mode()
    def logits(self, batch: StepBatch, hidden: torch.Tensor) -> StepLogits:
        """The last stage's logits: sampling rows stay on the device (the sampler runs there),
        prompt-logprob rows go to the host."""
        if self.pooler is not None:
            return StepLogits(torch.empty(0, device=self.device), {}, pool(self.model, self.pooler, hidden,
                                                                            batch.pool_spans))
        rows = to_device(batch.sample_rows, torch.long, self.device)
        sample = self.model.compute_logits(hidden[rows]).float() if batch.sample_rows else \
            torch.empty(0, device=self.device)
        prompt = {seq_id: self.model.compute_logits(hidden[torch.tensor(r, device=self.device)]).float().cpu()
                  for seq_id, r in batch.prompt_rows.items() if r}
        return StepLogits(sample, prompt)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for tensor in {cache.kv.data_ptr(): cache.kv for cache in self.kv_caches.values()}.values():
            tensor[dst] = tensor[src]  # layers of different KV groups share tensors: each copied once


    @torch.inference_mode()
    def lend_experts(self) -> None:
        """No batch here this step, but the other replicas' tokens still need this rank's experts."""
        self.exchange.active = True
        for module in self.model.modules():  # in layer order, as a real step meets them
            if isinstance(module, FusedMoE):
                module.lend()


def make_runner(loaded: LoadedModel, block_size: int) -> ModelRunner:
    runner = ModelRunner(loaded.model, loaded.kv_caches, loaded.backend, block_size, loaded.device,
                         loaded.sliding_window, loaded.lora_step, loaded.pooler, loaded.states)
    runner.exchange = loaded.placement.experts.exchange if loaded.placement.experts else None
    runner.host_kv = loaded.host_kv
    return runner


def sequence_lengths(batch: StepBatch, device: torch.device) -> torch.Tensor:
    """[T]: for each new token, its sequence's length: every token the sequence holds, not only those in the
    cache after this step (so every chunk of a long prompt sees what one forward over it would)."""
    counts = [end - start for start, end in zip(batch.query_start_loc, batch.query_start_loc[1:])]
    lengths = batch.seq_lens if not batch.total_lens else \
        [max(length, total) for length, total in zip(batch.seq_lens, batch.total_lens)]
    return torch.repeat_interleave(torch.tensor(lengths), torch.tensor(counts)).to(device)
