"""CUDA graphs for uniform steps: one captured forward per batch shape, replayed over static buffers.

A decode step launches hundreds of small kernels; on a GPU their launch overhead, not the
math, sets the step time. A step is uniform when every sequence adds the same number of tokens:
1 in a decode step, 1 + k in a speculative verification of k proposed tokens (draft models
propose k for every sequence). Each capture size (vLLM's: 1, 2, 4, then multiples of 8 up to
max_num_seqs) gets one graph per tokens-per-sequence of the model's forward over static input
buffers; a step of n sequences copies its ids, positions, slots and block tables into the
buffers of the next size up (padding rows store nothing: slot -1) and replays that graph. The
host side of those copies is one pinned buffer written in place each step, not new pinned tensors.

Models with a hybrid KV cache (sliding-window and full-attention layers, llmctl.sizing.kv.KVGroups)
get one slot mapping and one block-table buffer per KV group, each read by its group's backend.
With --enable-lora the step's adapter slots are a static one-hot (llmctl.engine.lora.slots).
At TP > 1 every rank captures the same graphs in the same order, the all-reduces inside them.

Models with recurrent layers (Mamba, Mamba2, gated DeltaNet) get one more static buffer: each row's state slot,
read on the device by the in-place decode kernels (padding rows: slot -1, which they skip); a step where a
sequence's state starts fresh (a one-token prompt) runs eagerly, as the state is zeroed first.

A speculative head that reads the target's hidden states (EAGLE, EAGLE-3, MTP) gets them from the graph just
replayed: each graph keeps the tensors its capture wrote them to (KEPT_STATES).

Only the `triton` attention backend can be captured (the `torch` backend groups sequences
on the host), and not with pipeline stages (hidden states arrive from another process) or
MoE experts exchanged across data-parallel replicas. Prefill and mixed steps run eagerly.
`--enforce-eager` turns graphs off. Without capture the same static-buffer path runs eagerly:
that is how the CPU tests check it (EngineConfig.graph_buffers_on_cpu).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.layers.grouped_attention import GroupedAttention
from llmctl.engine.layers.recurrent_state import StateCache, StateStep, decode_kernel
from llmctl.engine.layers.triton_attention import StepTensors, TritonAttention
from llmctl.engine.lora.slots import NO_ADAPTER, LoRAStep
from llmctl.engine.models.common import StepContext
from llmctl.engine.worker.block_tables import BlockTableCopy
from llmctl.engine.worker.loaded_model import LoadedModel
from llmctl.engine.worker.model_runner import sequence_lengths
from llmctl.sizing.weights import kv_heads_per_rank

logger = logging.getLogger("llmctl.engine")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's decode capture sizes: 1, 2, 4, then every multiple of 8, up to max_num_seqs."""
    sizes = [s for s in (1, 2, 4) if s <= max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)  # the largest batch the scheduler forms always has a graph
    return sizes


@dataclass(frozen=True)
class GraphInputs:
    """What a graph's forward reads besides its own buffers."""

    max_blocks_per_seq: int
    heads: int  # this rank's query and K/V heads
    kv_heads: int
    sliding_window: int | None
    lora_step: LoRAStep | None = None
    max_loras: int = 0
    lora_dtype: torch.dtype = torch.float32  # the adapters' slots' (the model's dtype)
    needs_lengths: bool = False  # LongRoPE: each token's sequence length (llmctl.engine.layers.positions)
    states: StateCache | None = None  # recurrent layers' state slots


class StepGraphs:
    """Static buffers of the largest shape; each (size, tokens per sequence) graph reads a prefix of them."""

    def __init__(self, model: nn.Module, backend: TritonAttention | GroupedAttention, kv_caches: dict[int, KVCache],
                 sizes: list[int], tokens_per_row: list[int], inputs: GraphInputs, device: torch.device,
                 capture: bool = True) -> None:
        self.model, self.backend, self.kv_caches, self.device = model, backend, kv_caches, device
        self.sizes, self.tokens_per_row, self.inputs = sorted(sizes), sorted(set(tokens_per_row)), inputs
        rows, tokens = self.sizes[-1], self.sizes[-1] * self.tokens_per_row[-1]
        self.input_ids = torch.zeros(tokens, dtype=torch.long, device=device)
        self.positions = torch.zeros(tokens, dtype=torch.long, device=device)
        self.lengths = torch.ones(tokens, dtype=torch.long, device=device) if inputs.needs_lengths else None
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        # one backend, slot mapping and block table per KV group (one group unless the KV cache is hybrid)
        self.backends = backend.backends if isinstance(backend, GroupedAttention) else [backend]
        self.slot_mappings = [torch.full((tokens,), -1, dtype=torch.long, device=device) for _ in self.backends]
        self.block_tables = [torch.zeros(rows, inputs.max_blocks_per_seq, dtype=torch.int32, device=device)
                             for _ in self.backends]
        self.lora_one_hot = torch.zeros(tokens, inputs.max_loras, dtype=inputs.lora_dtype, device=device) \
            if inputs.lora_step is not None else None
        self.state_slots = torch.full((rows,), -1, dtype=torch.long, device=device) \
            if inputs.states is not None else None
        self.steps = {(size, q): self._step_tensors(size, q) for size in self.sizes for q in self.tokens_per_row}
        # the host side of each step's inputs, filled in place (pinned once on CUDA, not per step): rows of ids,
        # positions, sequence lengths, then each KV group's slots (and the state slots); `_copied` marks when the
        # last copy out ended
        self.staging = torch.zeros(3 + len(self.backends) + (self.state_slots is not None), tokens, dtype=torch.int64,
                                   pin_memory=device.type == "cuda")
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.kept: dict[tuple[int, int], dict[str, torch.Tensor]] = {}  # per graph: its hidden states a head reads
        if capture:
            self._capture_all()

    @property
    def largest(self) -> int:
        return self.sizes[-1]

    def _step_tensors(self, size: int, q: int) -> list[StepTensors]:
        """Each KV group's attention inputs for `size` sequences of `q` new tokens: views of the buffers."""
        inputs, tokens = self.inputs, size * q
        block = next(iter(self.kv_caches.values())).kv.shape[1] if self.kv_caches else 1  # none: Mamba's layers only
        context = inputs.max_blocks_per_seq * block  # the longest met
        windows = self.backend.windows if isinstance(self.backend, GroupedAttention) else (inputs.sliding_window,)
        return [StepTensors(slots[:tokens], tables[:size], self.seq_lens[:size],
                            group.plan_uniform(size, q, inputs.heads, inputs.kv_heads, self.device, context),
                            list(range(0, tokens + 1, q)), window, context)
                for group, slots, tables, window in zip(self.backends, self.slot_mappings, self.block_tables,
                                                        windows)]

    def shape_of(self, batch: StepBatch) -> tuple[int, int] | None:
        """The graph a step replays: (size, tokens per sequence), or None when it runs eagerly (prefill and mixed
        steps, copy-on-write, more sequences than the largest graph)."""
        count, starts = len(batch.seq_lens), batch.query_start_loc
        q = batch.num_tokens // count if count else 0
        if batch.block_copies or q not in self.tokens_per_row or count > self.largest \
                or any(end - start != q for start, end in zip(starts, starts[1:])) \
                or (self.state_slots is not None and q in batch.seq_lens):  # a fresh state: zeroed eagerly
            return None
        return self.sizes[bisect.bisect_left(self.sizes, count)], q

    def _forward(self, shape: tuple[int, int]) -> torch.Tensor:
        tokens = shape[0] * shape[1]
        for backend, step in zip(self.backends, self.steps[shape]):
            backend.use_static(step)
        if self.lora_one_hot is not None:
            self.inputs.lora_step.use_static(self.lora_one_hot[:tokens])
        lengths = self.lengths[:tokens] if self.lengths is not None else None
        states = StateStep.graph_decodes(self.inputs.states, self.state_slots[:shape[0]]) \
            if self.inputs.states is not None and self.state_slots is not None else None
        return self.model(self.input_ids[:tokens],
                          StepContext(self.positions[:tokens], self.kv_caches, self.backend, lengths, states=states))

    @torch.inference_mode()
    def _capture_all(self) -> None:
        started = time.perf_counter()
        pool = None
        for shape in sorted(self.steps, reverse=True):  # largest first: the smaller graphs reuse its memory pool
            self._forward(shape)  # compiles the kernels (and, at TP > 1, opens the communicator) outside the capture
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[shape] = self._forward(shape)
            self.kept[shape] = {name: getattr(self.model, name) for name in KEPT_STATES
                                if getattr(self.model, name, None) is not None}
            pool = graph.pool()
            self.graphs[shape] = graph
        torch.cuda.synchronize(self.device)
        logger.info("CUDA graphs captured for batches of %s sequences (%s new tokens each) in %.2f s "
                    "(--enforce-eager turns them off)", ", ".join(map(str, self.sizes)),
                    " or ".join(map(str, self.tokens_per_row)), time.perf_counter() - started)

    @torch.inference_mode()
    def run(self, batch: StepBatch, shape: tuple[int, int], tables: BlockTableCopy | None = None,
            fill_placeholders: Callable[[StepBatch, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of a uniform step (`shape`: from shape_of; `tables`: the worker's copy
        of the block tables, read on the device when it has one there; `fill_placeholders`: async scheduling's
        tokens still on the device, written into the static ids)."""
        self._fill(batch, shape, tables)
        if fill_placeholders is not None:
            fill_placeholders(batch, self.input_ids)
        if self.graphs:
            self.graphs[shape].replay()
            for name, static in self.kept[shape].items():  # what eager forwards set, the graph wrote here
                setattr(self.model, name, static[:batch.num_tokens])
            return self.outputs[shape][:batch.num_tokens]
        return self._forward(shape)[:batch.num_tokens]

    def _fill(self, batch: StepBatch, shape: tuple[int, int], tables: BlockTableCopy | None) -> None:
        """The step's inputs into the static buffers: written into the staging rows on the host, then one
        non-blocking copy per buffer. Padding sequences get id 0, position 0 and slot -1 (which stores nothing)
        for each token, and a length of q: their rows are computed and dropped."""
        size, q = shape
        count, tokens, padded = len(batch.seq_lens), batch.num_tokens, size * q
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copies have read the staging rows (long done by now)
        host = self.staging.numpy()
        rows = [(batch.input_ids, 0, tokens, padded), (batch.positions, 0, tokens, padded),
                (batch.seq_lens, q, count, size)] + \
            [(slots, -1, tokens, padded) for slots in [batch.slot_mapping] + batch.group_slot_mappings] + \
            ([(batch.state_slots, -1, count, size)] if self.state_slots is not None else [])
        for row, (values, pad, used, end) in enumerate(rows):
            host[row, :used] = values
            host[row, used:end] = pad
        statics = [self.input_ids, self.positions, self.seq_lens, *self.slot_mappings] + \
            ([self.state_slots] if self.state_slots is not None else [])
        for row, (static, (_, _, _, end)) in enumerate(zip(statics, rows)):
            static[:end].copy_(self.staging[row, :end], non_blocking=True)
        self._fill_tables(batch, size, tables)
        if self.lengths is not None:
            self.lengths[:tokens].copy_(sequence_lengths(batch, self.device))
        if self.lora_one_hot is not None:
            self.lora_one_hot[:padded].copy_(_one_hot(batch.lora_slots, q, padded, self.lora_one_hot.shape[1]))
        if self._copied is not None:
            self._copied.record()

    def _fill_tables(self, batch: StepBatch, size: int, tables: BlockTableCopy | None) -> None:
        count = len(batch.seq_lens)
        group_tables = [batch.block_tables] + batch.group_block_tables
        for group, (static_tables, lists) in enumerate(zip(self.block_tables, group_tables)):
            gathered = tables.gathered(group, static_tables.shape[1]) if tables is not None else None
            if gathered is None:
                static_tables[:size].copy_(_padded_tables(lists, size, static_tables.shape[1]))
            else:  # padding rows keep earlier block ids: valid, and masked (nothing stored, outputs dropped)
                static_tables[:count, :gathered.shape[1]].copy_(gathered)


KEPT_STATES = ("last_hidden", "aux_hidden")  # a speculative head's inputs (llmctl.engine.spec_decode.hidden_proposer)


def _states_decode_in_place(loaded: LoadedModel) -> bool:
    """Whether the recurrent layers' decodes index their slots on the device (Triton's kernels; on CPUs the C++
    ones, float32 or bfloat16 states): the graphs' static slots need them."""
    states = loaded.states
    assert states is not None
    probe = torch.empty(0, device=loaded.device)
    return all(decode_kernel(probe, layer.ssm) is not None for layer in states.layers.values())


def _one_hot(seq_slots: list[int], tokens_per_row: int, rows: int, slots: int) -> torch.Tensor:
    """[rows, slots]: 1 where a token's sequence uses a slot; base-model and padding tokens use none."""
    one_hot = torch.zeros(rows, slots)
    for index, slot in enumerate(seq_slots):
        if slot != NO_ADAPTER:
            one_hot[index * tokens_per_row:(index + 1) * tokens_per_row, slot] = 1
    return one_hot


def _padded_tables(tables: list[list[int]], rows: int, width: int) -> torch.Tensor:
    padded = torch.zeros(rows, width, dtype=torch.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    return padded


def step_graphs(loaded: LoadedModel, config: EngineConfig) -> StepGraphs | None:
    """The graphs this process can use, or None (and the reason in the log). On a CPU only with
    EngineConfig.graph_buffers_on_cpu: the static buffers, run eagerly (there is nothing to capture)."""
    rank = loaded.placement.rank
    why_not = None
    if config.enforce_eager:
        why_not = "--enforce-eager"
    elif loaded.device.type != "cuda" and not config.graph_buffers_on_cpu:
        return None  # CPUs have no graphs to capture: nothing to say
    elif not all(isinstance(b, TritonAttention) for b in getattr(loaded.backend, "backends", [loaded.backend])):
        why_not = f"the {loaded.backend.name} attention backend cannot be captured (it reads host-side lists)"
    elif loaded.states is not None and not _states_decode_in_place(loaded):
        why_not = "recurrent layers without in-place decode kernels here (they gather the states on the host)"
    elif rank.pp > 1:
        why_not = "pipeline parallelism (a later stage's input arrives from another process)"
    elif loaded.placement.experts is not None and loaded.placement.experts.exchange is not None:
        why_not = "experts exchanged across data-parallel replicas (the exchange's sizes change every step)"
    if why_not:
        logger.info("CUDA graphs off: %s", why_not)
        return None
    spec, speculative = loaded.spec, config.speculative
    tokens_per_row = [1] + ([1 + speculative.num_speculative_tokens] if speculative is not None else [])
    inputs = GraphInputs(-(-loaded.max_model_len // config.block_size), spec.attention.num_heads // rank.tp,
                         kv_heads_per_rank(spec, rank.tp), loaded.sliding_window, loaded.lora_step, config.max_loras,
                         loaded.dtype, getattr(loaded.model, "needs_lengths", False), loaded.states)
    return StepGraphs(loaded.model, loaded.backend, loaded.kv_caches, capture_sizes(config.max_num_seqs),
                      tokens_per_row, inputs, loaded.device, capture=loaded.device.type == "cuda")
