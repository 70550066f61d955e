"""Attention for models whose layers read different block tables: one backend per KV group.

Models that mix sliding-window and full-attention layers (Gemma 2 and 3) keep one block table
per KV group (llmctl.sizing.kv.KVGroups, vLLM's hybrid KV cache layout): the sliding groups give
back the blocks their window has passed. Each group gets a backend of its own, prepared with its
group's slots and tables; a layer's call goes to the backend of the group its cache belongs to.
"""

from __future__ import annotations

import torch

from llmctl.engine.layers.attention import AttentionBackend, AttentionMetadata, KVCache
from llmctl.sizing.kv import KVGroups


class GroupedAttention:
    def __init__(self, backends: list[AttentionBackend], groups: KVGroups) -> None:
        self.backends, self.groups = backends, groups
        self.name = backends[0].name
        self._group_of_cache: dict[int, int] = {}

    @property
    def windows(self) -> tuple[int | None, ...]:
        return self.groups.windows

    def bind(self, caches: dict[int, KVCache]) -> None:
        """The caches the next steps run over (by layer): each answers to its group's backend."""
        self._group_of_cache = {id(cache): self.groups.group_of(layer) for layer, cache in caches.items()}

    def prepare_groups(self, metas: list[AttentionMetadata], device: torch.device) -> None:
        for backend, meta in zip(self.backends, metas):
            backend.prepare(meta, device)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        backend = self.backends[self._group_of_cache[id(cache)]]
        return backend.forward(query, key, value, cache, scale=scale, alibi_slopes=alibi_slopes, window=window,
                               softcap=softcap, sinks=sinks, chunk=chunk)

    @property
    def rotates_on_store(self) -> bool:
        return all(getattr(backend, "rotates_on_store", False) for backend in self.backends)

    def forward_rotated(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor, cache: KVCache, *, scale: float, window: int | None = None,
                        softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        backend = self.backends[self._group_of_cache[id(cache)]]
        return backend.forward_rotated(query, key, value, cos, sin, cache, scale=scale, window=window,  # type: ignore[attr-defined]
                                       softcap=softcap, sinks=sinks)
