"""Turns a scheduled step into a StepBatch (plain lists: the message a driver sends to its
workers), runs this process's part of the model on it, and returns the logits that matter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from llmctl.engine.layers.attention import AttentionBackend, AttentionMetadata, KVCache
from llmctl.engine.lora.slots import NO_ADAPTER, LoRAStep
from llmctl.engine.models.common import StepContext
from llmctl.engine.core.scheduler import SchedulerOutput
from llmctl.engine.core.sampler import SampleInput
from llmctl.engine.core.sequence import Sequence, TokenLogprob
from llmctl.kernels.transfer import to_device

if TYPE_CHECKING:
    from llmctl.engine.worker.cuda_graphs import DecodeGraphs


@dataclass
class StepBatch:
    """One step, flat: T new tokens of B sequences. Small and picklable."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]  # cache slot (block * block_size + offset) of each new token
    query_start_loc: list[int]  # [B + 1]
    seq_lens: list[int]  # [B] tokens in the cache after this step
    block_tables: list[list[int]]
    sample_rows: list[int]  # last token of each sequence that samples (and each of its proposed tokens)
    prompt_rows: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> rows scoring prompt tokens
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    lora_slots: list[int] = field(default_factory=list)  # [B] each sequence's adapter slot; empty: no adapters
    sampling: list[SampleInput] | None = None  # one per sample row: the last pipeline stage samples them


    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class StepLogits:
    sample_logits: torch.Tensor  # [N, V] float32 on the model's device, one row per sampling sequence
    prompt_logits: dict[int, torch.Tensor]  # seq_id -> [rows, V]


@dataclass
class SampledTokens:
    """What a pipeline's last stage returns for a batch with `sampling`: ids, not logits."""

    tokens: list[tuple[int, TokenLogprob | None]]  # one per sample row


@dataclass
class StepFailed:
    """Sent back instead of a result when a step failed for its requests (the rank itself is fine)."""

    reason: str


@dataclass
class StepResult(StepLogits):
    sample_seqs: list[Sequence] = field(default_factory=list)


def build_batch(sched: SchedulerOutput, block_size: int,
                lora_slots: list[int] | None = None) -> tuple[StepBatch, list[Sequence]]:
    """The step's batch and the sequences its sample rows belong to (in row order)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, lens, tables = [0], [], []
    sample_rows, sample_seqs = [], []
    prompt_rows: dict[int, list[int]] = {}
    for item in sched.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        row0 = len(ids)
        proposed = item.draft.token_ids if item.draft is not None else []
        for pos in range(start, start + item.num_new_tokens):
            ids.append(seq.token_at(pos) if pos < seq.num_tokens else proposed[pos - seq.num_tokens])
            positions.append(pos)
            slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
        starts.append(len(ids))
        lens.append(start + item.num_new_tokens)
        tables.append(_readable(seq))
        if item.samples:  # with a draft: the last real token's row, then one row per proposed token
            sample_rows += range(len(ids) - 1 - len(proposed), len(ids))
            sample_seqs.append(seq)
        if seq.params.prompt_logprobs is not None and start < len(seq.prompt_token_ids) - 1:
            last = min(start + item.num_new_tokens, len(seq.prompt_token_ids) - 1)
            prompt_rows[seq.seq_id] = [row0 + p - start for p in range(start, last)]
    batch = StepBatch(ids, positions, slots, starts, lens, tables, sample_rows, prompt_rows,
                      list(sched.block_copies), lora_slots or [])
    return batch, sample_seqs


def _readable(seq: Sequence) -> list[int]:
    """The block table with slid-out entries pointing at block 0: the window mask hides what is there."""
    if not seq.num_slid_out_blocks:
        return seq.block_table
    return [0] * seq.num_slid_out_blocks + seq.block_table[seq.num_slid_out_blocks:]


def is_decode_step(batch: StepBatch) -> bool:
    """One new token per sequence and no copy-on-write: a step a captured graph can replay."""
    return batch.num_tokens == len(batch.seq_lens) and not batch.block_copies


class ModelRunner:
    """Runs one process's model part: every layer (TP 1), or one pipeline stage's shard."""

    def __init__(self, model: nn.Module, kv_caches: dict[int, KVCache], backend: AttentionBackend,
                 block_size: int, device: torch.device, sliding_window: int | None = None,
                 lora_step: LoRAStep | None = None) -> None:
        self.model = model
        self.lora_step = lora_step
        self.sliding_window = sliding_window
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.device = device
        self.graphs: DecodeGraphs | None = None  # captured decode steps (llmctl.engine.worker.cuda_graphs)

    def execute(self, sched: SchedulerOutput) -> StepResult:
        """A whole step in this process (the single-process engine)."""
        batch, seqs = build_batch(sched, self.block_size)
        logits = self.logits(batch, self.forward(batch))
        return StepResult(logits.sample_logits, logits.prompt_logits, seqs)

    @torch.inference_mode()
    def forward(self, batch: StepBatch, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """This stage's layers on the batch: token ids in (first stage) or the previous stage's hidden states."""
        if self.graphs is not None and hidden is None and is_decode_step(batch) \
                and len(batch.seq_lens) <= self.graphs.largest:
            return self.graphs.run(batch)
        self._copy_blocks(batch.block_copies)
        device = self.device
        meta = AttentionMetadata(
            slot_mapping=to_device(batch.slot_mapping, torch.long, device),
            query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens, block_tables=batch.block_tables,
            block_size=self.block_size, sliding_window=self.sliding_window)
        self.backend.prepare(meta, device)
        if self.lora_step is not None:
            self.lora_step.set(batch.lora_slots or [NO_ADAPTER] * len(batch.seq_lens), batch.query_start_loc, device)
        positions = to_device(batch.positions, torch.long, device)
        input_ids = to_device(batch.input_ids, torch.long, device)
        return self.model(input_ids, StepContext(positions, self.kv_caches, self.backend), hidden)

    @torch.inference_mode()
    def logits(self, batch: StepBatch, hidden: torch.Tensor) -> StepLogits:
        """The last stage's logits: sampling rows stay on the device (the sampler runs there),
        prompt-logprob rows go to the host."""
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
        for cache in self.kv_caches.values():
            cache.kv[dst] = cache.kv[src]
