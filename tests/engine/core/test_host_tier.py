"""The KV cache's CPU tier as the block manager drives it: an evicted cached block is stored (a copy decided
before anything can overwrite it), a later prompt whose block the device pool lost gets a fresh block loaded from
the tier, copies leave in the order decided and only with a step that runs, a slot being read is never reused
for a store in the same step, and token ids are compared (a hash collision loads nothing)."""

from __future__ import annotations

from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.host_tier import HostTier
from llmctl.engine.core.scheduler import Scheduler
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import HostCopy
from llmctl.engine.sampling_params import SamplingParams

BS = 4


def seq(seq_id: int, tokens: list[int]) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=str(seq_id), index=0, prompt_token_ids=tokens, params=SamplingParams())


def compute(manager: BlockManager, s: Sequence) -> None:
    manager.match_prefix(s)
    manager.allocate(s, s.num_tokens - s.num_computed_tokens)
    s.num_computed_tokens = s.num_tokens
    manager.register_full_blocks(s)


def test_an_evicted_block_is_stored_and_a_later_prompt_loads_it_into_a_fresh_block():
    manager = BlockManager(num_blocks=3, block_size=BS, host=HostTier(num_blocks=8, block_bytes=100))
    a = seq(0, [1, 1, 1, 1, 2, 2, 2, 2, 9])
    compute(manager, a)
    first_a, second_a = a.block_table[:2]
    manager.free(a)
    b = seq(1, [5] * 12)  # takes every block: a's two cached blocks are evicted, stored first
    compute(manager, b)
    stores = manager.host.take_copies()
    assert stores == [HostCopy(True, second_a, 0), HostCopy(True, first_a, 1)]  # the deepest block goes first
    manager.free(b)
    again = seq(2, [1, 1, 1, 1, 2, 2, 2, 2, 7])  # a's prefix: both blocks from the tier
    manager.match_prefix(again)
    assert again.num_computed_tokens == 8 and len(again.block_table) == 2
    loads = manager.host.take_copies()
    # b's blocks are evicted (and stored) to make room, each before the load that overwrites it
    assert [c.store for c in loads] == [True, False, True, False]
    assert [c.block for c in loads if not c.store] == again.block_table
    assert [c.slot for c in loads if not c.store] == [1, 0]
    for store, load in zip(loads[::2], loads[1::2]):
        assert store.block == load.block
    stats = manager.host.stats
    assert (stats.hits, stats.blocks_stored, stats.blocks_loaded) == (8, 4, 2)
    assert stats.queries == 9 + 12 + 9  # each prompt's tokens the device pool did not hold


def test_a_slot_being_read_is_not_reused_until_its_step_is_sent():
    tier = HostTier(num_blocks=2)
    tier.store((0, 1), (1,), block_id=0)
    tier.store((0, 2), (2,), block_id=1)
    tier.take_copies()
    slot = tier.claim((0, 1), (1,))  # the least recently used entry, now being read
    tier.load(slot, block_id=5)
    tier.store((0, 3), (3,), block_id=6)  # the tier is full: the other slot is reused, not the claimed one
    copies = tier.take_copies()
    assert copies == [HostCopy(False, 5, slot), HostCopy(True, 6, 1 - slot)]
    assert tier.claim((0, 2), (2,)) is None and tier.claim((0, 1), (1,)) == slot


def test_tokens_are_compared_and_a_collision_loads_nothing():
    tier = HostTier(num_blocks=2)
    tier.store((0, 7), (1, 2), block_id=0)
    assert tier.claim((0, 7), (3, 4)) is None and tier.claim((0, 7), (1, 2)) == 0


def test_copies_wait_for_a_step_that_runs():
    manager = BlockManager(num_blocks=2, block_size=BS, host=HostTier(num_blocks=4))
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=100)
    manager.host.store((0, 1), (1, 1, 1, 1), block_id=0)
    assert scheduler.schedule().empty and manager.host.pending  # nothing to run: kept for the next step
    scheduler.add(seq(0, [3, 3]))
    out = scheduler.schedule()
    assert out.host_copies == [HostCopy(True, 0, 0)] and not manager.host.pending


def test_reset_prefix_cache_forgets_the_tier_and_gives_back_slots_being_read():
    tier = HostTier(num_blocks=1)
    tier.store((0, 1), (1,), block_id=0)
    tier.take_copies()
    tier.load(tier.claim((0, 1), (1,)), block_id=3)
    manager = BlockManager(num_blocks=2, block_size=BS, host=tier)
    manager.reset_prefix_cache()
    assert tier.claim((0, 1), (1,)) is None and tier.free_slots == []
    tier.take_copies()
    assert tier.free_slots == [0]
