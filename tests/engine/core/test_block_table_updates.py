"""Block tables go to the workers as changes (llmctl.engine.core.table_updates). The worker's copy — the
host lists every backend reads, and for the Triton backend the device tensor attention reads — must
equal the whole tables the driver would have sent, at every step: through appends, copy-on-write forks,
preemption, sliding windows giving blocks back, and speculative tails trimmed."""

from __future__ import annotations

import torch

import llmctl.engine.front.llm_engine as front
from helpers.families import gemma3_text_config
from helpers.models import save_random_model, small_config
from llmctl import LLM, SamplingParams
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.table_updates import TableRows
from llmctl.engine.sampling_params import SamplingParams as Params
from llmctl.engine.worker.block_tables import BlockTableCopy

PROMPTS = ["The capital of France is", "Hello, my name is", "1, 2, 3, 4,", "The capital of France is a city"]


def watch_every_step(llm: LLM, monkeypatch) -> list[int]:
    """After each step is submitted, compare the worker's copy with the tables built whole; returns
    how many entries each step's updates carried (the check's own record of what was sent). The copy
    keeps its tensor too (on this CPU: the Triton backend's device copy, without interpreting attention;
    the Triton engine tests read it through the kernels)."""
    runner = llm.engine.executor.runner
    runner.tables = BlockTableCopy(len(runner.tables.host), torch.device("cpu"))
    built: list = []
    build = front.build_batch

    def build_both(sched, block_size, lora_slots=None, table_rows=None, pending_rows=None):
        batch, seqs = build(sched, block_size, lora_slots, table_rows, pending_rows)
        built.append((batch, build(sched, block_size, lora_slots)[0]))  # the whole tables, as before
        return batch, seqs

    monkeypatch.setattr(front, "build_batch", build_both)
    executor, sent = llm.engine.executor, []
    submit = executor.submit

    def submit_and_check(batch):
        submit(batch)
        ours, whole = built[-1]
        assert ours is batch and batch.table_rows
        expected = [whole.block_tables, *whole.group_block_tables]
        assert [batch.block_tables, *batch.group_block_tables] == expected
        copy = executor.runner.tables
        for group, tables in enumerate(expected):
            rows = copy.gathered(group, max(map(len, tables))).tolist()
            assert [row[:len(table)] for row, table in zip(rows, tables)] == tables
        sent.append(sum(len(u.blocks[0]) for u in batch.table_updates))

    executor.submit = submit_and_check
    return sent


def test_forks_preemption_and_prefix_hits(tmp_path, tokenizer, monkeypatch):
    """n = 2 samples share their prompt's blocks and copy the last on write; a 6-block pool preempts."""
    folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path / "llama", tokenizer)
    probe = LLM(str(folder), max_model_len=40, block_size=8)
    block_bytes = probe.engine.loaded.kv_geometry.block_bytes
    llm = LLM(str(folder), max_model_len=40, block_size=8, kv_cache_memory=6 * block_bytes)
    sent = watch_every_step(llm, monkeypatch)
    llm.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=24, ignore_eos=True))
    assert llm.engine.scheduler.num_preemptions > 0
    assert len(sent) > 14 and max(sent) > 1 and 0 in sent  # whole prompts; steps with nothing new to send


def test_sliding_window_groups_giving_blocks_back(tmp_path, tokenizer, monkeypatch):
    """Gemma 3's hybrid cache: a full group and sliding groups whose slid-out entries are rewritten."""
    folder = save_random_model(gemma3_text_config(len(tokenizer)), tmp_path / "gemma3", tokenizer)
    llm = LLM(str(folder), max_model_len=256, max_num_batched_tokens=16, block_size=8)
    watch_every_step(llm, monkeypatch)
    llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_speculative_tails_trimmed(tmp_path, tokenizer, monkeypatch):
    """n-gram speculation allocates blocks for proposed tokens and trims those rejected."""
    folder = save_random_model(small_config("mistral-window", tokenizer), tmp_path / "mistral", tokenizer)
    llm = LLM(str(folder), max_model_len=256, block_size=8, speculative_config={
        "method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    watch_every_step(llm, monkeypatch)
    llm.generate(["1 2 3 1 2 3 1 2 3 1 2 3 1 2", "a b a b a b a b a"],
                 SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
    stats = llm.engine.speculator.stats  # the steps above checked tables only if proposals came, some rejected
    assert stats.num_draft_tokens > 0 and stats.num_accepted_tokens < stats.num_draft_tokens, stats


def test_appends_rewrites_and_a_freed_row_reused():
    rows = TableRows()
    first, second = (Sequence(i, str(i), 0, [1, 2, 3], Params()) for i in range(2))
    first.block_table = [5, 6]
    row, update = rows.update(first)
    assert row == 0 and update.start == 0 and update.blocks == [[5, 6]]
    first.block_table.append(7)
    assert rows.update(first)[1].blocks == [[7]] and rows.update(first) == (0, None)  # appended; then nothing
    first.block_table[1], first.tables_changed_from = 8, 1  # copy-on-write, as the block manager marks it
    update = rows.update(first)[1]
    assert update.start == 1 and update.blocks == [[8, 7]]
    freed = [first.seq_id]
    rows.release(freed)
    assert freed == [] and rows.rows == {}
    second.block_table = [9]
    row, update = rows.update(second)
    assert row == 0 and update.start == 0 and update.blocks == [[9]]  # the row reused, written whole


def test_a_trimmed_tail_is_marked_for_rewriting():
    """Blocks given back after rejected proposals may come back as other blocks: their entries are resent."""
    from llmctl.engine.core.block_manager import BlockManager
    from llmctl.engine.core.table_updates import UNCHANGED

    manager = BlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, "0", 0, [1, 2, 3, 4, 5], Params())
    manager.allocate(seq, 5 + 6)  # the prompt and six proposed tokens: 3 blocks
    seq.num_computed_tokens, seq.tables_changed_from = 6, UNCHANGED  # two proposals accepted; tables sent
    manager.trim(seq)
    assert len(seq.block_table) == 2 and seq.tables_changed_from == 2
