"""KV block pool: block tables, reference counts, prefix caching, copy-on-write.

Sliding-window models give back the blocks that every later query has slid past, so a
sequence holds about the window's worth of blocks however long it grows; its block table
keeps SLID_OUT in their place.

A full block is identified by a chained hash of its parent's hash and its token ids, so
equal prefixes map to equal blocks. The stored token ids are compared on every hit, so a
hash collision can never serve the wrong K/V. Freed blocks that carry a hash stay
findable until they are reused, least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from llmctl.engine.core.sequence import Sequence

SLID_OUT = -1  # a block-table entry whose block was given back (outside the sliding window)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of those, found in the cache


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    sliding_window: int | None = None  # every layer attends to at most this many tokens back
    blocks: list[Block] = field(init=False)
    free_ids: list[int] = field(init=False)  # never hashed, or hash dropped
    evictable: OrderedDict[int, None] = field(init=False)  # free but still cached, LRU order
    cached: dict[int, int] = field(init=False)  # hash -> block id
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def __post_init__(self) -> None:
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free_ids = list(range(self.num_blocks - 1, -1, -1))
        self.evictable = OrderedDict()
        self.cached = {}

    # -- accounting ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (vLLM's kv_cache_usage)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size)
        return max(0, total - len(seq.block_table))

    # -- prefix cache ---------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> None:
        """Attach cached blocks for the longest cached prefix of a new sequence's tokens.

        At least one token is always left to compute, so the step yields logits."""
        if seq.block_table:
            return
        tokens = seq.all_token_ids
        max_blocks = (len(tokens) - 1) // self.block_size
        self.stats.queries += len(seq.prompt_token_ids)
        if not self.enable_prefix_caching or seq.params.prompt_logprobs is not None:
            return
        parent = seq.prefix_root
        for index in range(max_blocks):
            chunk = tuple(tokens[index * self.block_size:(index + 1) * self.block_size])
            digest = chain_hash(parent, chunk)
            block_id = self.cached.get(digest)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            self._take(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(digest)
            parent = digest
        hit = len(seq.block_table) * self.block_size
        seq.num_computed_tokens = hit
        seq.num_cached_tokens = hit
        self.stats.hits += min(hit, len(seq.prompt_token_ids))

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks whose tokens are all computed, so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens, seq.num_tokens) // self.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else seq.prefix_root
        for index in range(len(seq.block_hashes), full):
            chunk = tuple(seq.token_at(p) for p in range(index * self.block_size, (index + 1) * self.block_size))
            digest = chain_hash(parent, chunk)
            block = self.blocks[seq.block_table[index]]
            if block.hash is None and digest not in self.cached:
                block.hash, block.token_ids = digest, chunk
                self.cached[digest] = block.block_id
            seq.block_hashes.append(digest)
            parent = digest

    def release_slid_out(self, seq: Sequence) -> None:
        """Give back the blocks before the window of the sequence's next query (at num_computed_tokens),
        which sees keys after position - window. Full blocks were hashed already and stay cached."""
        if not self.sliding_window:
            return
        first_needed = seq.num_computed_tokens - self.sliding_window + 1
        end = min(max(0, first_needed) // self.block_size, len(seq.block_table))
        for index in range(seq.num_slid_out_blocks, end):
            self._release(seq.block_table[index])
            seq.block_table[index] = SLID_OUT
        seq.num_slid_out_blocks = max(seq.num_slid_out_blocks, end)

    # -- allocation -----------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) + self._cow_needed(seq) <= self.num_free_blocks

    def can_allocate_in_place(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Room for the tokens without a copy-on-write (which only a model step can carry out)."""
        return not self._cow_needed(seq) and self.can_allocate(seq, num_new_tokens)

    def trim(self, seq: Sequence) -> None:
        """Give back trailing blocks beyond the computed tokens: those allocated for speculative
        tokens that were rejected. They were never full, so never hashed."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > max(keep, seq.num_slid_out_blocks):
            self._release(seq.block_table.pop())

    def allocate(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Give `seq` room for `num_new_tokens` more tokens. Returns (src, dst) block copies
        for copy-on-write: a shared, partly filled last block is copied before it is written."""
        copies = []
        if self._cow_needed(seq):
            shared = seq.block_table[-1]
            fresh = self._pop_free()
            self._release(shared)
            seq.block_table[-1] = fresh
            copies.append((shared, fresh))
        for _ in range(self.blocks_needed(seq, num_new_tokens)):
            seq.block_table.append(self._pop_free())
        return copies

    def _cow_needed(self, seq: Sequence) -> int:
        if not seq.block_table or seq.num_computed_tokens % self.block_size == 0:
            return 0
        last = seq.num_computed_tokens // self.block_size
        if last >= len(seq.block_table):
            return 0
        return int(self.blocks[seq.block_table[last]].ref_count > 1)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares all of the parent's blocks (n > 1 completions of one prompt)."""
        for block_id in parent.block_table[parent.num_slid_out_blocks:]:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_slid_out_blocks = parent.num_slid_out_blocks
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def free(self, seq: Sequence) -> None:
        # Release the tail first so that, when evicted, the deepest blocks go before their prefixes.
        for block_id in reversed(seq.block_table[seq.num_slid_out_blocks:]):
            self._release(block_id)
        seq.block_table = []
        seq.num_slid_out_blocks = 0
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def reset_prefix_cache(self) -> None:
        for block_id in list(self.evictable):
            self._drop_hash(self.blocks[block_id])
            self.free_ids.append(block_id)
        self.evictable.clear()

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
            self._drop_hash(self.blocks[block_id])
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
