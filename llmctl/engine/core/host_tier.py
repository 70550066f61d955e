"""The KV cache's CPU tier (vLLM's --kv-offloading-size, its native offloading): a second, larger pool of
blocks in host memory, keyed like the prefix cache. A full block the device pool evicts is stored there
first; a prompt whose next block is missing on the device but held here gets a fresh device block loaded from
it instead of computing it again. This is the driver's bookkeeping; the copies are carried out by the workers
(llmctl.engine.worker.kv_offload) at the start of the next step, in the order they were decided, before the
step's own copies and forward pass — so a store always reads a block before anything overwrites it, and a load
lands before the step that attends to it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from llmctl.engine.core.step_messages import HostCopy

Key = tuple[int, int]  # (KV group, chain hash), as the device pool's prefix cache


@dataclass
class HostTierStats:
    queries: int = 0  # prompt tokens looked up in the tier (those the device pool did not hold)
    hits: int = 0  # of those, found and loaded
    blocks_stored: int = 0
    blocks_loaded: int = 0


@dataclass
class HostTier:
    num_blocks: int
    block_bytes: int = 0  # what one block's copy moves, all layers and ranks (for the metrics)
    entries: OrderedDict[Key, int] = field(default_factory=OrderedDict)  # key -> slot, least recently used first
    token_ids: dict[int, tuple[int | str, ...]] = field(default_factory=dict)  # slot -> its block's key tokens
    stats: HostTierStats = field(default_factory=HostTierStats)
    pending: list[HostCopy] = field(default_factory=list)  # decided, not yet sent to the workers
    free_slots: list[int] = field(init=False)
    _reading: set[int] = field(default_factory=set)  # slots a pending load reads: not reused until it is sent

    def __post_init__(self) -> None:
        self.free_slots = list(range(self.num_blocks - 1, -1, -1))

    def store(self, key: Key, token_ids: tuple[int | str, ...], block_id: int) -> None:
        """An evicted device block: kept here (a copy at the next step) unless it is here already."""
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        slot = self._free_slot()
        if slot is None:
            return  # every slot is being read this step: the block is dropped, as without the tier
        self.entries[key] = slot
        self.token_ids[slot] = token_ids
        self.pending.append(HostCopy(store=True, block=block_id, slot=slot))
        self.stats.blocks_stored += 1

    def claim(self, key: Key, token_ids: tuple[int | str, ...]) -> int | None:
        """The slot holding `key` with these tokens, kept from reuse until the next step is sent; or None."""
        slot = self.entries.get(key)
        if slot is None or self.token_ids[slot] != token_ids:
            return None
        self.entries.move_to_end(key)
        self._reading.add(slot)
        return slot

    def load(self, slot: int, block_id: int) -> None:
        """A claimed slot's copy into a device block (at the next step)."""
        self.pending.append(HostCopy(store=False, block=block_id, slot=slot))
        self.stats.blocks_loaded += 1

    def take_copies(self) -> list[HostCopy]:
        """The copies decided since the last step, in order, for the step about to be submitted."""
        copies, self.pending = self.pending, []
        self.free_slots += [slot for slot in self._reading if slot not in self.token_ids]  # forgotten by clear()
        self._reading.clear()
        return copies

    def clear(self) -> None:
        """Forget every block (reset_prefix_cache); copies already decided are still sent."""
        self.entries.clear()
        self.token_ids.clear()
        self.free_slots = [slot for slot in range(self.num_blocks - 1, -1, -1) if slot not in self._reading]

    def _free_slot(self) -> int | None:
        if self.free_slots:
            return self.free_slots.pop()
        for key, slot in self.entries.items():  # the least recently used slot no pending load reads
            if slot not in self._reading:
                del self.entries[key]
                del self.token_ids[slot]
                return slot
        return None
