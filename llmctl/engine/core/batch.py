"""The driver turns a scheduled step into a StepBatch: flat token ids, positions, cache slots and
block tables, plus the rows to sample and to score as prompt log-probabilities."""

from __future__ import annotations

from llmctl.engine.core.block_manager import SLID_OUT
from llmctl.engine.core.scheduler import SchedulerOutput
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import EmbeddingSlice, EncoderInput, StepBatch, TableUpdate
from llmctl.engine.core.table_updates import TableRows


def build_batch(sched: SchedulerOutput, block_size: int, lora_slots: list[int] | None = None,
                table_rows: TableRows | None = None,
                pending_rows: dict[int, int] | None = None) -> tuple[StepBatch, list[Sequence]]:
    """The step's batch and the sequences its sample rows belong to (in row order). With `table_rows`
    the block tables go as changes to the workers' copy, not whole. `pending_rows` (async scheduling): the
    sample row, in the step still running, of each sequence whose next input that step is sampling."""
    ids: list[int] = []
    positions: list[int] = []
    groups = len(sched.scheduled[0].seq.block_tables) if sched.scheduled else 1
    slots: list[list[int]] = [[] for _ in range(groups)]  # per KV group
    tables: list[list[list[int]]] = [[] for _ in range(groups)]
    starts, lens, total_lens = [0], [], []
    sample_rows: list[int] = []
    sample_seqs: list[Sequence] = []
    prompt_rows: dict[int, list[int]] = {}
    rows: list[int] = []
    updates: list[TableUpdate] = []
    placeholders: list[tuple[int, int]] = []
    for item in sched.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        row0 = len(ids)
        proposed = item.draft.token_ids if item.draft is not None else []
        for pos in range(start, start + item.num_new_tokens):
            if pos < seq.num_tokens:
                ids.append(seq.token_at(pos))
            elif item.draft is not None:
                ids.append(proposed[pos - seq.num_tokens])
            else:  # sampled by the step in flight: filled in when that step's tokens exist (executor.overlap)
                placeholders.append((len(ids), (pending_rows or {})[seq.seq_id]))
                ids.append(0)
            positions.append(pos)
        for group, table in enumerate(seq.block_tables):
            slots[group] += [table[pos // block_size] * block_size + pos % block_size
                             for pos in range(start, start + item.num_new_tokens)]
            if table_rows is None:
                tables[group].append(_readable(table))
        if table_rows is not None:
            row, update = table_rows.update(seq)
            rows.append(row)
            updates += [update] if update is not None else []
        starts.append(len(ids))
        lens.append(start + item.num_new_tokens)
        total_lens.append(seq.num_tokens)
        if item.samples and seq.pooling is None:  # with a draft: the last real token's row, then one row per proposed token
            sample_rows += range(len(ids) - 1 - len(proposed), len(ids))
            sample_seqs.append(seq)
        if seq.params.prompt_logprobs is not None and start < len(seq.prompt_token_ids) - 1:
            last = min(start + item.num_new_tokens, len(seq.prompt_token_ids) - 1)
            prompt_rows[seq.seq_id] = [row0 + p - start for p in range(start, last)]
    batch = StepBatch(ids, positions, slots[0], starts, lens, tables[0], sample_rows, prompt_rows,
                      list(sched.block_copies), lora_slots or [], total_lens=total_lens,
                      group_slot_mappings=slots[1:], group_block_tables=tables[1:], table_rows=rows,
                      table_updates=updates, placeholders=placeholders, host_copies=list(sched.host_copies),
                      encoder_inputs=[EncoderInput(i.content_hash, i.data) for i in sched.encoder.encode],
                      encoder_frees=list(sched.encoder.free), pool_spans=pool_spans(sched),
                      state_slots=[item.seq.state_slot for item in sched.scheduled])
    batch.embedding_slices, batch.mrope_positions = multimodal_rows(sched)
    batch.both_ways_spans = both_ways_spans(sched)
    return batch, sample_seqs


def pool_spans(sched: SchedulerOutput) -> dict[int, tuple[int, int]]:
    """Each pooling sequence whose prompt this step completes: its rows (first, end); pooled, not sampled."""
    spans, row0 = {}, 0
    for item in sched.scheduled:
        if item.samples and item.seq.pooling is not None:
            spans[item.seq.seq_id] = (row0, row0 + item.num_new_tokens)
        row0 += item.num_new_tokens
    return spans


def both_ways_spans(sched: SchedulerOutput) -> list[tuple[int, int, int]]:
    """(sequence index, first, last position) of each image in this step's chunks whose tokens attend to
    each other in both directions (Gemma 3; the scheduler never splits one)."""
    spans = []
    for index, item in enumerate(sched.scheduled):
        start = item.seq.num_computed_tokens
        spans += [(index, *image.span) for image in item.seq.mm_items
                  if image.both_ways and image.overlaps(start, start + item.num_new_tokens)]
    return spans


def multimodal_rows(sched: SchedulerOutput) -> tuple[list[EmbeddingSlice], list[list[int]]]:
    """Where the step's rows take image embeddings, and (M-RoPE models with images) every row's 3 positions."""
    slices: list[EmbeddingSlice] = []
    mrope = any(item.seq.mrope is not None for item in sched.scheduled)
    rope_rows: list[list[int]] = [[], [], []] if mrope else []
    row0 = 0
    for item in sched.scheduled:
        seq, start = item.seq, item.seq.num_computed_tokens
        if mrope:
            add_mrope_positions(rope_rows, seq, start, item.num_new_tokens)
        if seq.mm_items and start < len(seq.prompt_token_ids):
            slices += embedding_slices(seq, start, item.num_new_tokens, row0)
        row0 += item.num_new_tokens
    return slices, rope_rows


def add_mrope_positions(rows: list[list[int]], seq: Sequence, start: int, count: int) -> None:
    """Each new token's (t, h, w) rotary position; a sequence without images has its position three times."""
    for position in range(start, start + count):
        triple = seq.mrope.at(position) if seq.mrope is not None else (position, position, position)
        for row, value in zip(rows, triple):
            row.append(value)


def embedding_slices(seq: Sequence, start: int, count: int, row0: int) -> list[EmbeddingSlice]:
    """Where this chunk of the prompt (positions start..start+count, rows from row0) holds image placeholders."""
    slices = []
    for item in seq.mm_items:
        positions, sources = item.rows_within(start, start + count)
        if positions:
            slices.append(EmbeddingSlice(item.content_hash, [row0 + p - start for p in positions], sources))
    return slices


def _readable(table: list[int]) -> list[int]:
    """The block table with slid-out entries pointing at block 0: the window mask hides what is there."""
    return [0 if block == SLID_OUT else block for block in table] if SLID_OUT in table[:1] else table

