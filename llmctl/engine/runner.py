"""Turns a scheduled step into flat tensors, runs the model, returns the logits that matter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from llmctl.engine.layers.attention import AttentionBackend, AttentionMetadata, KVCache
from llmctl.engine.models.common import StepContext
from llmctl.engine.scheduler import SchedulerOutput
from llmctl.engine.sequence import Sequence


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: list[int]  # last token of each sequence that samples
    sample_seqs: list[Sequence]
    prompt_rows: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> rows whose logits predict prompt tokens


@dataclass
class StepResult:
    sample_logits: torch.Tensor  # [N, V] float32, one row per sampling sequence
    sample_seqs: list[Sequence]
    prompt_logits: dict[int, torch.Tensor]  # seq_id -> [rows, V]


def build_inputs(sched: SchedulerOutput, block_size: int, device: torch.device,
                 sliding_window: int | None = None) -> StepInputs:
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, lens, tables = [0], [], []
    sample_rows, sample_seqs = [], []
    prompt_rows: dict[int, list[int]] = {}
    for item in sched.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        row0 = len(ids)
        for pos in range(start, start + item.num_new_tokens):
            ids.append(seq.token_at(pos))
            positions.append(pos)
            slots.append(seq.block_table[pos // block_size] * block_size + pos % block_size)
        starts.append(len(ids))
        lens.append(start + item.num_new_tokens)
        tables.append(_readable(seq))
        if item.samples:
            sample_rows.append(len(ids) - 1)
            sample_seqs.append(seq)
        if seq.params.prompt_logprobs is not None and start < len(seq.prompt_token_ids) - 1:
            last = min(start + item.num_new_tokens, len(seq.prompt_token_ids) - 1)
            prompt_rows[seq.seq_id] = [row0 + p - start for p in range(start, last)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        query_start_loc=starts, seq_lens=lens, block_tables=tables, block_size=block_size,
        sliding_window=sliding_window,
    )
    return StepInputs(torch.tensor(ids, dtype=torch.long, device=device),
                      torch.tensor(positions, dtype=torch.long, device=device),
                      meta, sample_rows, sample_seqs, prompt_rows)


def _readable(seq: Sequence) -> list[int]:
    """The block table with slid-out entries pointing at block 0: the window mask hides what is there."""
    if not seq.num_slid_out_blocks:
        return seq.block_table
    return [0] * seq.num_slid_out_blocks + seq.block_table[seq.num_slid_out_blocks:]


class ModelRunner:
    def __init__(self, model: nn.Module, kv_caches: list[KVCache], backend: AttentionBackend,
                 block_size: int, device: torch.device, sliding_window: int | None = None) -> None:
        self.model = model
        self.sliding_window = sliding_window
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = block_size
        self.device = device

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> StepResult:
        self._copy_blocks(sched.block_copies)
        inputs = build_inputs(sched, self.block_size, self.device, self.sliding_window)
        self.backend.prepare(inputs.meta, self.device)
        hidden = self.model(inputs.input_ids, StepContext(inputs.positions, self.kv_caches, self.backend))
        rows = torch.tensor(inputs.sample_rows, dtype=torch.long, device=self.device)
        sample_logits = self.model.compute_logits(hidden[rows]).float() if inputs.sample_rows else \
            torch.empty(0, device=self.device)
        prompt_logits = {
            seq_id: self.model.compute_logits(hidden[torch.tensor(r, device=self.device)]).float()
            for seq_id, r in inputs.prompt_rows.items() if r
        }
        return StepResult(sample_logits.cpu(), inputs.sample_seqs, {k: v.cpu() for k, v in prompt_logits.items()})

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            cache.kv[dst] = cache.kv[src]
