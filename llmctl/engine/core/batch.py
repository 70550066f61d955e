"""The driver turns a scheduled step into a StepBatch: flat token ids, positions, cache slots and
block tables, plus the rows to sample and to score as prompt log-probabilities."""

from __future__ import annotations

from llmctl.engine.core.scheduler import SchedulerOutput
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import StepBatch


def build_batch(sched: SchedulerOutput, block_size: int,
                lora_slots: list[int] | None = None) -> tuple[StepBatch, list[Sequence]]:
    """The step's batch and the sequences its sample rows belong to (in row order)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts, lens, tables, total_lens = [0], [], [], []
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
        total_lens.append(seq.num_tokens)
        tables.append(_readable(seq))
        if item.samples:  # with a draft: the last real token's row, then one row per proposed token
            sample_rows += range(len(ids) - 1 - len(proposed), len(ids))
            sample_seqs.append(seq)
        if seq.params.prompt_logprobs is not None and start < len(seq.prompt_token_ids) - 1:
            last = min(start + item.num_new_tokens, len(seq.prompt_token_ids) - 1)
            prompt_rows[seq.seq_id] = [row0 + p - start for p in range(start, last)]
    batch = StepBatch(ids, positions, slots, starts, lens, tables, sample_rows, prompt_rows,
                      list(sched.block_copies), lora_slots or [], total_lens=total_lens)
    return batch, sample_seqs


def _readable(seq: Sequence) -> list[int]:
    """The block table with slid-out entries pointing at block 0: the window mask hides what is there."""
    if not seq.num_slid_out_blocks:
        return seq.block_table
    return [0] * seq.num_slid_out_blocks + seq.block_table[seq.num_slid_out_blocks:]


def is_decode_step(batch: StepBatch) -> bool:
    """One new token per sequence and no copy-on-write: a step a captured graph can replay."""
    return batch.num_tokens == len(batch.seq_lens) and not batch.block_copies
