"""Block manager and scheduler on their own: allocation, hashing, eviction, preemption, abort."""

from __future__ import annotations

from llmctl.engine.core.block_manager import BlockManager, chain_hash
from llmctl.engine.core.scheduler import Scheduler
from llmctl.engine.core.sequence import Sequence, SequenceStatus
from llmctl.engine.sampling_params import SamplingParams

BS = 4


def seq(seq_id: int, tokens: list[int], **params) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=str(seq_id), index=0, prompt_token_ids=tokens,
                    params=SamplingParams(**params))


def compute(manager: BlockManager, s: Sequence, n: int) -> None:
    """What a step does for a sequence: room for n tokens, compute them, register full blocks."""
    manager.allocate(s, n)
    s.num_computed_tokens += n
    manager.register_full_blocks(s)


def test_allocation_and_free():
    manager = BlockManager(num_blocks=8, block_size=BS)
    s = seq(0, list(range(10)))
    assert manager.blocks_needed(s, 10) == 3
    compute(manager, s, 10)
    assert len(s.block_table) == 3 and manager.num_free_blocks == 5
    assert all(manager.blocks[b].ref_count == 1 for b in s.block_table)
    manager.free(s)
    assert manager.num_free_blocks == 8 and s.block_table == [] and s.num_computed_tokens == 0


def test_prefix_hit_reuses_full_blocks_and_leaves_one_token():
    manager = BlockManager(num_blocks=16, block_size=BS)
    first = seq(0, list(range(12)))
    compute(manager, first, 12)
    second = seq(1, list(range(12)))  # identical prompt: 2 blocks cached, the last token recomputed
    manager.match_prefix(second)
    assert second.block_table == first.block_table[:2]
    assert second.num_computed_tokens == 8
    assert manager.blocks[first.block_table[0]].ref_count == 2
    third = seq(2, list(range(8)) + [99, 98, 97, 96, 95])
    manager.match_prefix(third)
    assert third.num_computed_tokens == 8
    assert manager.stats.queries == 25 and manager.stats.hits == 16


def test_hash_chain_depends_on_parent_and_collisions_are_checked():
    assert chain_hash(None, (1, 2)) != chain_hash(chain_hash(None, (0, 0)), (1, 2))
    manager = BlockManager(num_blocks=8, block_size=BS)
    first = seq(0, [1, 2, 3, 4, 5])
    compute(manager, first, 5)
    # Forge a collision: the hash of another block now points at first's block.
    forged = chain_hash(None, (9, 9, 9, 9))
    manager.cached[forged] = first.block_table[0]
    other = seq(1, [9, 9, 9, 9, 9])
    manager.match_prefix(other)
    assert other.num_computed_tokens == 0 and other.block_table == []


def test_freed_cached_blocks_stay_findable_and_evict_lru():
    manager = BlockManager(num_blocks=4, block_size=BS)
    a = seq(0, [1, 1, 1, 1, 2])
    compute(manager, a, 5)
    block_a = a.block_table[0]
    manager.free(a)
    b = seq(1, [1, 1, 1, 1, 3])
    manager.match_prefix(b)
    assert b.block_table == [block_a]  # found after being freed
    manager.free(b)
    # Fill the pool with new tokens: uncached blocks go first, then the LRU cached one.
    c = seq(2, list(range(100, 116)))
    compute(manager, c, 16)
    assert block_a in c.block_table
    assert c.block_table.index(block_a) == 3  # the never-cached blocks were used before evicting it
    assert chain_hash(None, (1, 1, 1, 1)) not in manager.cached
    d = seq(3, [1, 1, 1, 1, 4])
    manager.free(c)
    manager.match_prefix(d)
    assert d.num_computed_tokens == 0  # block_a was evicted and rewritten


def test_fork_and_copy_on_write():
    manager = BlockManager(num_blocks=8, block_size=BS)
    parent = seq(0, [1, 2, 3, 4, 5, 6])
    compute(manager, parent, 6)  # blocks: [full, partial(2 tokens)]
    child = seq(1, [1, 2, 3, 4, 5, 6])
    manager.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(manager.blocks[b].ref_count == 2 for b in parent.block_table)
    parent.output_token_ids.append(7)
    copies = manager.allocate(parent, 1)  # writes into the shared partial block: copy it first
    assert len(copies) == 1 and copies[0][0] == child.block_table[1] and copies[0][1] == parent.block_table[1]
    assert parent.block_table[0] == child.block_table[0]
    assert manager.blocks[child.block_table[1]].ref_count == 1
    child.output_token_ids.append(8)
    assert manager.allocate(child, 1) == []  # now the only owner: written in place


def make_scheduler(num_blocks: int, budget: int, max_seqs: int = 8) -> Scheduler:
    return Scheduler(BlockManager(num_blocks, BS), max_num_seqs=max_seqs, max_num_batched_tokens=budget)


def run_step(scheduler: Scheduler):
    out = scheduler.schedule()
    for item in out.scheduled:
        samples = item.samples
        item.seq.num_computed_tokens += item.num_new_tokens
        scheduler.block_manager.register_full_blocks(item.seq)
        if samples:
            item.seq.output_token_ids.append(1)
    return out


def test_budget_decodes_first_then_chunked_prefill():
    scheduler = make_scheduler(num_blocks=32, budget=6)
    a, b = seq(0, list(range(5))), seq(1, list(range(10, 20)))
    scheduler.add(a)
    scheduler.add(b)
    out = run_step(scheduler)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 5), (1, 1)]
    out = run_step(scheduler)  # a decodes first, b continues its prompt with the rest of the budget
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 5)]
    assert out.num_tokens <= 6 and len(b.output_token_ids) == 0
    out = run_step(scheduler)
    assert [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled] == [(0, 1), (1, 4)]
    assert len(b.output_token_ids) == 1  # its prompt is complete: it sampled


def test_max_num_seqs_caps_running():
    scheduler = make_scheduler(num_blocks=32, budget=100, max_seqs=2)
    for i in range(3):
        scheduler.add(seq(i, [i] * 3))
    out = run_step(scheduler)
    assert len(out.scheduled) == 2 and len(scheduler.waiting) == 1


def test_preemption_takes_the_newest_and_keeps_its_output():
    scheduler = make_scheduler(num_blocks=3, budget=100)
    old, new = seq(0, [1] * 4), seq(1, [2] * 3)
    scheduler.add(old)
    scheduler.add(new)
    run_step(scheduler)  # one block each; both need a second one soon, only one is left
    for _ in range(4):
        out = run_step(scheduler)
        if out.preempted:
            break
    assert out.preempted == [new]
    assert new.status == SequenceStatus.WAITING and scheduler.waiting[0] is new
    assert new.output_token_ids and new.num_computed_tokens == 0 and new.block_table == []
    assert scheduler.num_preemptions == 1


def test_abort_frees_everything_at_once():
    scheduler = make_scheduler(num_blocks=8, budget=100)
    running, waiting = seq(0, [1] * 9), seq(1, [2] * 40)
    scheduler.add(running)
    run_step(scheduler)
    scheduler.add(waiting)
    scheduler.finish(running)
    scheduler.finish(waiting)
    assert scheduler.block_manager.num_free_blocks == 8
    assert not scheduler.has_work


def test_priority_policy_admits_the_most_urgent_first_and_preempts_the_least():
    """vLLM's --scheduling-policy priority: lower priority values first, then arrival; when blocks run out
    the least urgent running sequence is preempted, even an older one (fcfs would take the newest)."""
    scheduler = Scheduler(BlockManager(32, BS), max_num_seqs=1, max_num_batched_tokens=100,
                          scheduling_policy="priority")
    for seq_id, priority in ((0, 5), (1, -1), (2, 5), (3, 0)):
        scheduler.add(seq(seq_id, [seq_id] * 3, priority=priority))
    assert [s.seq_id for s in scheduler.waiting] == [1, 3, 0, 2]
    assert [s.seq.seq_id for s in run_step(scheduler).scheduled] == [1]

    scheduler = Scheduler(BlockManager(3, BS), max_num_seqs=8, max_num_batched_tokens=100,
                          scheduling_policy="priority")
    lax, urgent = seq(0, [1] * 4, priority=10), seq(1, [2] * 3, priority=0)
    scheduler.add(lax)
    run_step(scheduler)  # lax runs first (alone), urgent arrives after: running is [lax, urgent]
    scheduler.add(urgent)
    run_step(scheduler)
    for _ in range(4):
        out = run_step(scheduler)
        if out.preempted:
            break
    assert out.preempted == [lax] and scheduler.waiting[0] is lax and urgent.status == SequenceStatus.RUNNING
    assert [s.seq_id for s in scheduler.running] == [1]
