"""CUDA graphs for decode steps: one captured forward per batch size, replayed over static buffers.

A decode step launches hundreds of small kernels; on a GPU their launch overhead, not the
math, sets the step time. Each capture size (vLLM's: 1, 2, 4, then multiples of 8 up to
max_num_seqs) gets one graph of the model's forward over static input buffers; a step of n
sequences copies its ids, positions, slots and block tables into the buffers of the next
size up (padding rows store nothing: slot -1) and replays that graph. The host side of those
copies is one pinned buffer written in place each step, not new pinned tensors.

Models with a hybrid KV cache (sliding-window and full-attention layers, llmctl.sizing.kv.KVGroups)
get one slot mapping and one block-table buffer per KV group, each read by its group's backend.

Only the `triton` attention backend can be captured (the `torch` backend groups sequences
on the host), and only with every layer in this process (TP 1, PP 1). `--enforce-eager`
turns graphs off. With `capture=False` the same static-buffer path runs eagerly: that is
how the CPU tests check it.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.layers.grouped_attention import GroupedAttention
from llmctl.engine.layers.triton_attention import StepTensors, TritonAttention
from llmctl.engine.models.common import StepContext
from llmctl.engine.worker.block_tables import BlockTableCopy
from llmctl.engine.worker.loaded_model import LoadedModel
from llmctl.sizing.weights import kv_heads_per_rank

logger = logging.getLogger("llmctl.engine")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's decode capture sizes: 1, 2, 4, then every multiple of 8, up to max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)  # the largest batch the scheduler forms always has a graph
    return sizes


class DecodeGraphs:
    """Static buffers of the largest size; each size's graph reads a prefix of them."""

    def __init__(self, model: nn.Module, backend: TritonAttention | GroupedAttention, kv_caches: dict[int, KVCache],
                 sizes: list[int], max_blocks_per_seq: int, heads: int, kv_heads: int, sliding_window: int | None,
                 device: torch.device, capture: bool = True) -> None:
        self.model, self.backend, self.kv_caches, self.device = model, backend, kv_caches, device
        self.sizes = sorted(sizes)
        largest = self.sizes[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.long, device=device)
        self.positions = torch.zeros(largest, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(largest, dtype=torch.int32, device=device)
        # one backend, slot mapping and block table per KV group (one group unless the KV cache is hybrid)
        self.backends = backend.backends if isinstance(backend, GroupedAttention) else [backend]
        windows = backend.windows if isinstance(backend, GroupedAttention) else (sliding_window,)
        self.slot_mappings = [torch.full((largest,), -1, dtype=torch.long, device=device) for _ in self.backends]
        self.block_tables = [torch.zeros(largest, max_blocks_per_seq, dtype=torch.int32, device=device)
                             for _ in self.backends]
        context = max_blocks_per_seq * next(iter(kv_caches.values())).kv.shape[1]  # the longest a graph meets
        self.steps = {size: [StepTensors(slots[:size], tables[:size], self.seq_lens[:size],
                                         group.plan_decodes(size, heads, kv_heads, device, context),
                                         list(range(size + 1)), window, context)
                             for group, slots, tables, window in zip(self.backends, self.slot_mappings,
                                                                     self.block_tables, windows)]
                      for size in self.sizes}
        # the host side of each step's inputs, filled in place (pinned once on CUDA, not per step): rows of ids,
        # positions, sequence lengths, then each KV group's slots; `_copied` marks when the last copy out ended
        self.staging = torch.zeros(3 + len(self.backends), largest, dtype=torch.int64,
                                   pin_memory=device.type == "cuda")
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def _forward(self, size: int) -> torch.Tensor:
        for backend, step in zip(self.backends, self.steps[size]):
            backend.use_static(step)
        return self.model(self.input_ids[:size], StepContext(self.positions[:size], self.kv_caches, self.backend))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        started = time.perf_counter()
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self._forward(size)  # compiles the kernels outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        logger.info("CUDA graphs captured for decode batches of %s sequences in %.2f s (--enforce-eager turns "
                    "them off)", ", ".join(map(str, self.sizes)), time.perf_counter() - started)

    @torch.inference_mode()
    def run(self, batch: StepBatch, tables: BlockTableCopy | None = None,
            fill_placeholders: Callable[[StepBatch, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Hidden states [n, hidden] of a decode step of n ≤ largest sequences (`tables`: the worker's copy
        of the block tables, read on the device when it has one there; `fill_placeholders`: async scheduling's
        tokens still on the device, written into the static ids)."""
        count = len(batch.seq_lens)
        size = self.sizes[bisect.bisect_left(self.sizes, count)]
        self._fill(batch, size, tables)
        if fill_placeholders is not None:
            fill_placeholders(batch, self.input_ids)
        if self.graphs:
            self.graphs[size].replay()
            return self.outputs[size][:count]
        return self._forward(size)[:count]

    def _fill(self, batch: StepBatch, size: int, tables: BlockTableCopy | None) -> None:
        """The step's inputs into the static buffers: written into the staging rows on the host, then one
        non-blocking copy per buffer (padding rows: id 0, length 1, slot -1, which stores nothing)."""
        count = len(batch.seq_lens)
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copies have read the staging rows (long done by now)
        host = self.staging.numpy()
        rows = [(batch.input_ids, 0), (batch.positions, 0), (batch.seq_lens, 1)] + \
            [(slots, -1) for slots in [batch.slot_mapping] + batch.group_slot_mappings]
        for row, (values, pad) in enumerate(rows):
            host[row, :count] = values
            host[row, count:size] = pad
        statics = [self.input_ids, self.positions, self.seq_lens, *self.slot_mappings]
        for row, static in enumerate(statics):
            static[:size].copy_(self.staging[row, :size], non_blocking=True)
        group_tables = [batch.block_tables] + batch.group_block_tables
        for group, (static_tables, lists) in enumerate(zip(self.block_tables, group_tables)):
            gathered = tables.gathered(group, static_tables.shape[1]) if tables is not None else None
            if gathered is None:
                static_tables[:size].copy_(_padded_tables(lists, size, static_tables.shape[1]))
            else:  # padding rows keep earlier block ids: valid, and masked (length 1, nothing stored)
                static_tables[:count, :gathered.shape[1]].copy_(gathered)
        if self._copied is not None:
            self._copied.record()


def _padded_tables(tables: list[list[int]], rows: int, width: int) -> torch.Tensor:
    padded = torch.zeros(rows, width, dtype=torch.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    return padded


def decode_graphs(loaded: LoadedModel, config: EngineConfig, window: int | None, capture: bool = True
                  ) -> DecodeGraphs | None:
    """The graphs this process can use, or None (and the reason in the log)."""
    why_not = None
    if config.enforce_eager:
        why_not = "--enforce-eager"
    elif loaded.device.type != "cuda" and capture:
        return None  # CPUs have no graphs to capture: nothing to say
    elif not all(isinstance(b, TritonAttention) for b in getattr(loaded.backend, "backends", [loaded.backend])):
        why_not = f"the {loaded.backend.name} attention backend cannot be captured (it reads host-side lists)"
    elif loaded.placement.rank.world_size > 1:
        why_not = "tensor/pipeline parallelism (collectives are not captured yet)"
    elif loaded.lora_slots:
        why_not = "--enable-lora (a step's adapter slots are not captured yet)"
    if why_not:
        logger.info("CUDA graphs off: %s", why_not)
        return None
    spec = loaded.spec
    return DecodeGraphs(loaded.model, loaded.backend, loaded.kv_caches, capture_sizes(config.max_num_seqs),
                        -(-loaded.max_model_len // config.block_size), spec.attention.num_heads,
                        kv_heads_per_rank(spec, 1), window, loaded.device, capture)
