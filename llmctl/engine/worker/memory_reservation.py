"""Memory another part of the engine will need on this GPU after the KV pool is sized."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryReservation:
    what: str = ""
    fixed_bytes: int = 0  # e.g. a draft model's weights
    bytes_per_block: int = 0  # e.g. the draft's KV for each block of the target's pool

    def kv_bytes_beside(self, available: int, block_bytes: int) -> int:
        """The target's share of `available` when each of its blocks brings `bytes_per_block` along."""
        if not self.fixed_bytes and not self.bytes_per_block:
            return available
        blocks = max(0, available - self.fixed_bytes) // (block_bytes + self.bytes_per_block)
        return blocks * block_bytes
