"""KV block pool: block tables, reference counts, prefix caching, copy-on-write; and the recurrent layers'
state slots (llmctl.engine.layers.recurrent_state), taken with a sequence's first blocks and freed with them.

A sequence holds one block table per KV group (llmctl.sizing.kv.KVGroups: one group for most
models; a full-attention group and sliding-window groups for models that mix them, as vLLM's
hybrid KV cache manager does), all drawing on one pool. Sliding groups give back the blocks
that every later query has slid past, so they hold about the window's worth of blocks however
long the sequence grows; their tables keep SLID_OUT in those places.

A full block is identified by a chained hash of its parent's hash and its token ids, so
equal prefixes map to equal blocks. The stored token ids are compared on every hit, so a
hash collision can never serve the wrong K/V. Freed blocks that carry a hash stay
findable until they are reused, least recently freed first — and with a CPU tier
(llmctl.engine.core.host_tier), findable there after that.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

from llmctl.engine.core.host_tier import HostTier
from llmctl.engine.core.sequence import Sequence

SLID_OUT = -1  # a block-table entry whose block was given back (outside the sliding window)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: tuple[int, int] | None = None  # (KV group, chain hash) once registered in the prefix cache
    token_ids: tuple[int | str, ...] = ()  # the block's key: token ids, then its images' hashes


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, found in the cache


def chain_hash(parent: int | None, token_ids: tuple[int | str, ...]) -> int:
    return hash((parent, token_ids))


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    sliding_window: int | None = None  # every layer attends to at most this many tokens back (one group)
    group_windows: tuple[int | None, ...] = ()  # per KV group (hybrid models); overrides sliding_window
    blocks: list[Block] = field(init=False)
    free_ids: list[int] = field(init=False)  # never hashed, or hash dropped
    evictable: OrderedDict[int, None] = field(init=False)  # free but still cached, LRU order
    cached: dict[tuple[int, int], int] = field(init=False)  # (group, hash) -> block id
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    freed_seq_ids: list[int] = field(default_factory=list)  # since the last step was built (table_updates)
    state_slots: int = 0  # recurrent layers' state cache: one slot per running sequence (0: no such layers)
    free_states: list[int] = field(init=False)
    host: HostTier | None = None  # the KV cache's CPU tier (--kv-offloading-size); one KV group only

    def __post_init__(self) -> None:
        windows = self.group_windows or (self.sliding_window,)
        self.group_windows = tuple(windows)
        sliding = {w for w in windows if w}
        assert len(sliding) <= 1, "one sliding window per model"
        self.sliding_window = next(iter(sliding), None)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_ids = list(range(self.num_blocks - 1, -1, -1))
        self.evictable = OrderedDict()
        self.cached = {}
        self.free_states = list(range(self.state_slots))  # a heap: the lowest slot first, so that the running
        # sequences' slots stay consecutive (their decodes update views of the state cache)

    # -- accounting ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (vLLM's kv_cache_usage)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    @property
    def num_groups(self) -> int:
        return len(self.group_windows)

    def tables(self, seq: Sequence) -> list[list[int]]:
        """The sequence's block table of each KV group (created empty on first use)."""
        if len(seq.group_tables) != self.num_groups - 1:
            seq.group_tables = [[] for _ in range(self.num_groups - 1)]
        return seq.block_tables

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """New blocks in every group: all tables grow together, one entry per block of tokens."""
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table)) * self.num_groups

    # -- prefix cache ---------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> None:
        """Attach cached blocks for the longest cached prefix of a new sequence's tokens.

        At least one token is always left to compute, so the step yields logits."""
        if seq.block_table:
            return
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self.stats.queries += len(seq.prompt_token_ids)
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return
        parent = seq.prefix_root
        tables = self.tables(seq)
        on_device = 0
        for index in range(max_blocks):
            chunk = seq.block_key(index, self.block_size)
            digest = chain_hash(parent, chunk)
            hits = self._device_hits(digest, chunk)
            if hits is not None:
                for table, block_id in zip(tables, hits):
                    self._take(block_id)
                    table.append(block_id)
                on_device += 1
            elif (loaded := self._load_from_host(digest, chunk)) is not None:
                tables[0].append(loaded)
            else:
                break
            seq.block_hashes.append(digest)
            parent = digest
        if self.host is not None:  # what the device pool did not hold was asked of the CPU tier
            self.host.stats.queries += max(0, len(seq.prompt_token_ids) - on_device * self.block_size)
        hit = len(seq.block_table) * self.block_size
        seq.num_computed_tokens = hit
        seq.num_cached_tokens = hit
        self.stats.hits += min(hit, len(seq.prompt_token_ids))

    def _device_hits(self, digest: int, chunk: tuple[int | str, ...]) -> list[int] | None:
        """The cached block of every KV group for this chunk, or None (a hit needs them all)."""
        found = [self.cached.get((group, digest)) for group in range(self.num_groups)]
        hits = [block_id for block_id in found if block_id is not None and self.blocks[block_id].token_ids == chunk]
        return hits if len(hits) == self.num_groups else None

    def _load_from_host(self, digest: int, chunk: tuple[int | str, ...]) -> int | None:
        """A fresh device block that the CPU tier's copy of this chunk is loaded into, or None."""
        host, key = self.host, (0, digest)
        if host is None or self.num_free_blocks == 0:
            return None
        slot = host.claim(key, chunk)  # before the pop, whose eviction may store a block in the tier
        if slot is None:
            return None
        block_id = self._pop_free()
        host.load(slot, block_id)
        block = self.blocks[block_id]
        block.hash, block.token_ids = key, chunk
        self.cached[key] = block_id
        host.stats.hits += self.block_size
        return block_id

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks whose tokens are all computed, so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else seq.prefix_root
        for index in range(len(seq.block_hashes), full):
            chunk = seq.block_key(index, self.block_size)
            digest = chain_hash(parent, chunk)
            for group, table in enumerate(self.tables(seq)):
                if table[index] == SLID_OUT:
                    continue
                block, key = self.blocks[table[index]], (group, digest)
                if block.hash is None and key not in self.cached:
                    block.hash, block.token_ids = key, chunk
                    self.cached[key] = block.block_id
            seq.block_hashes.append(digest)
            parent = digest

    def release_slid_out(self, seq: Sequence) -> None:
        """Give back the blocks before the window of the sequence's next query (at num_computed_tokens),
        which sees keys after position - window. Full blocks were hashed already and stay cached."""
        if not self.sliding_window:
            return
        first_needed = seq.num_computed_tokens - self.sliding_window + 1
        end = min(max(0, first_needed) // self.block_size, len(seq.block_table))
        for table in self._sliding_tables(seq):
            for index in range(seq.num_slid_out_blocks, end):
                self._release(table[index])
                table[index] = SLID_OUT
        if end > seq.num_slid_out_blocks:
            seq.tables_changed_from = min(seq.tables_changed_from, seq.num_slid_out_blocks)
        seq.num_slid_out_blocks = max(seq.num_slid_out_blocks, end)

    def _sliding_tables(self, seq: Sequence) -> list[list[int]]:
        return [table for table, window in zip(self.tables(seq), self.group_windows) if window]

    # -- allocation -----------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) + self._cow_needed(seq) <= self.num_free_blocks

    def can_allocate_in_place(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Room for the tokens without a copy-on-write (which only a model step can carry out)."""
        return not self._cow_needed(seq) and self.can_allocate(seq, num_new_tokens)

    def trim(self, seq: Sequence) -> None:
        """Give back trailing blocks beyond the computed tokens: those allocated for speculative
        tokens that were rejected. They were never full, so never hashed."""
        keep = max(-(-seq.num_computed_tokens // self.block_size), seq.num_slid_out_blocks)
        if len(seq.block_table) > keep:
            seq.tables_changed_from = min(seq.tables_changed_from, keep)
        for table in self.tables(seq):
            while len(table) > keep:
                self._release(table.pop())

    def allocate(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Give `seq` room for `num_new_tokens` more tokens. Returns (src, dst) block copies
        for copy-on-write: a shared, partly filled last block is copied before it is written."""
        copies = []
        tables = self.tables(seq)
        if self.state_slots and seq.state_slot < 0:  # the scheduler admits at most max_num_seqs: one is free
            seq.state_slot = heapq.heappop(self.free_states)
        for table in tables:
            if self._shared_last(table, seq):
                shared = table[-1]
                fresh = self._pop_free()
                self._release(shared)
                table[-1] = fresh
                copies.append((shared, fresh))
                seq.tables_changed_from = min(seq.tables_changed_from, len(table) - 1)
        for _ in range(self.blocks_needed(seq, num_new_tokens) // self.num_groups):
            for table in tables:
                table.append(self._pop_free())
        return copies

    def _cow_needed(self, seq: Sequence) -> int:
        return sum(self._shared_last(table, seq) for table in self.tables(seq))

    def _shared_last(self, table: list[int], seq: Sequence) -> bool:
        """The partly filled block the next token goes into is shared with another sequence."""
        if not table or seq.num_computed_tokens % self.block_size == 0:
            return False
        last = seq.num_computed_tokens // self.block_size
        return last < len(table) and table[last] != SLID_OUT and self.blocks[table[last]].ref_count > 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares all of the parent's blocks (n > 1 completions of one prompt). Not with recurrent
        layers: their requests' n sequences are separate from the start (LLMEngine.add_request)."""
        assert not self.state_slots, "a sequence's recurrent state is its own: it cannot be forked"
        for table in self.tables(parent):
            for block_id in table:
                if block_id != SLID_OUT:
                    self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.group_tables = [list(table) for table in parent.group_tables]
        child.num_slid_out_blocks = parent.num_slid_out_blocks
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def free(self, seq: Sequence) -> None:
        # Release the tail first so that, when evicted, the deepest blocks go before their prefixes.
        for table in self.tables(seq):
            for block_id in reversed(table):
                if block_id != SLID_OUT:
                    self._release(block_id)
        seq.block_table = []
        seq.group_tables = []
        if seq.state_slot >= 0:
            heapq.heappush(self.free_states, seq.state_slot)
            seq.state_slot = -1
        seq.tables_changed_from = 0
        self.freed_seq_ids.append(seq.seq_id)  # its workers' table row can go to another sequence
        seq.num_slid_out_blocks = 0
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for block_id in list(self.evictable):
            self._drop_hash(self.blocks[block_id])
            self.free_ids.append(block_id)
        self.evictable.clear()
        if self.host is not None:
            self.host.clear()

    # -- internals ------------------------------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self.evictable.pop(block_id, None)
        block.ref_count += 1

    def _pop_free(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.pop()
        else:
            block_id, _ = self.evictable.popitem(last=False)  # least recently freed
            block = self.blocks[block_id]
            if self.host is not None and block.hash is not None:
                self.host.store(block.hash, block.token_ids, block_id)  # copied out before anything is written
            self._drop_hash(block)
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, "block released more often than taken"
        if block.ref_count == 0:
            if block.hash is not None:
                self.evictable[block_id] = None
            else:
                self.free_ids.append(block_id)

    def _drop_hash(self, block: Block) -> None:
        if block.hash is not None and self.cached.get(block.hash) == block.block_id:
            del self.cached[block.hash]
        block.hash, block.token_ids = None, ()
