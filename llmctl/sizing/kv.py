"""KV cache bytes per token and per sequence on one GPU, as vLLM allocates them.

A block holds ``block_size`` tokens of the layers of one KV group (all layers, when they are of
one kind; see KVGroups for models that mix sliding-window and full attention). Full-attention
layers keep every token of a sequence; sliding-window layers keep at most the window (plus the
tokens of one scheduled step). MLA (DeepSeek) stores one compressed latent per token and layer,
the same on every TP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.checkpoint.spec import ModelSpec
from llmctl.settings import DEFAULT_BLOCK_SIZE, KVCacheFormat, kv_cache_format
from llmctl.sizing.weights import kv_heads_per_rank

BLOCK_SIZE = DEFAULT_BLOCK_SIZE  # the block size plan sizes with: serve's default
UNBOUNDED = 2**62  # a max length that no context reaches
def planned_kv_format(kv_cache_dtype: str) -> KVCacheFormat:
    """`plan --kv-cache-dtype`: the formats llmctl serves (llmctl.settings; vLLM's names)."""
    return kv_cache_format(kv_cache_dtype)


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """`--kv-cache-dtype auto` stores K/V in the model's dtype."""
    return planned_kv_format(kv_cache_dtype).element_bytes(model_dtype_bytes)


def kv_bytes_per_token_per_layer(spec: ModelSpec, tp: int, dtype_bytes: int) -> int:
    return spec.kv_bytes_per_token_layer(dtype_bytes, kv_heads_per_rank(spec, tp))


@dataclass(frozen=True)
class KVGroups:
    """vLLM's hybrid KV cache layout. Layers of one kind (full attention, or one sliding window) form
    groups of `group_size` layers; a sequence has one block table per group, and a block id, owned by one
    group at a time, is one page in each of `group_size` tensors — the j-th tensor holds the j-th layer of
    every group. Sliding groups give back the blocks their window has passed while full groups keep all.
    One kind of layer: a single group of every layer (one tensor per layer, one block table)."""

    groups: tuple[tuple[int, ...], ...]  # layer indices; full-attention groups first
    windows: tuple[int | None, ...]  # per group: its sliding window, None for full attention
    group_size: int

    @property
    def full_groups(self) -> int:
        return sum(1 for window in self.windows if window is None)

    @property
    def sliding_groups(self) -> int:
        return len(self.windows) - self.full_groups

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    def slot(self, layer: int) -> int:
        """Which tensor holds this layer: its place in its group."""
        for group in self.groups:
            if layer in group:
                return group.index(layer)
        raise KeyError(layer)

    def group_of(self, layer: int) -> int:
        return next(g for g, group in enumerate(self.groups) if layer in group)


def attention_layers(spec: ModelSpec) -> list[int]:
    """The layers that keep K/V per token: all but those with a recurrent state (Mamba mixers) and Nemotron-H's
    MLP blocks."""
    return [i for i in range(spec.num_layers) if spec.attends(i)]


def kv_groups(spec: ModelSpec) -> KVGroups:
    """vLLM's grouping (kv_cache_utils._get_kv_cache_groups_uniform_page_size): the group size is the
    smaller kind's layer count (the larger's when it has under 1.5× as many); a kind with n groups gives
    group i its layers i, i + n, i + 2n … so pipeline stages get whole slots."""
    window = spec.attention.sliding_window
    kinds = spec.attention.layer_types
    attending = attention_layers(spec)
    sliding = [i for i in attending if window and i < len(kinds) and kinds[i] == "sliding"]
    full = [i for i in attending if i not in set(sliding)]
    buckets = [(layers, kind_window) for layers, kind_window in ((full, None), (sliding, window)) if layers]
    if not buckets:  # every layer keeps a recurrent state (Mamba): one group of no layers, no K/V at all
        return KVGroups(((),), (None,), 0)
    size = min(len(layers) for layers, _ in buckets)
    largest = max(len(layers) for layers, _ in buckets)
    if largest < size * 1.5:
        size = largest
    groups, windows = [], []
    for layers, kind_window in buckets:
        count = math.ceil(len(layers) / size)
        groups += [tuple(layers[i::count]) for i in range(count)]
        windows += [kind_window] * count
    return KVGroups(tuple(groups), tuple(windows), size)


@dataclass(frozen=True)
class StageKV:
    """KV geometry of one GPU of one pipeline stage: `slots` tensors of `block_size`-token pages, a block
    id being one page in each; a sequence holds blocks in every KV group (llmctl.sizing.kv.KVGroups)."""

    full_layers: int  # of this stage's layers, those with full attention
    sliding_layers: int
    window: int | None
    bytes_per_token_layer: int
    block_size: int = BLOCK_SIZE
    slots: int | None = None  # KV tensors on this GPU (None: one per layer)
    full_groups: int = 1  # block tables a sequence holds for full-attention layers (all stages together)
    sliding_groups: int = 0

    @property
    def layers(self) -> int:
        return self.full_layers + self.sliding_layers

    @property
    def bytes_per_token(self) -> int:
        """All layers on this GPU, one token: 2 · layers · kv_heads/TP · head_dim · dtype bytes."""
        return self.layers * self.bytes_per_token_layer

    @property
    def block_bytes(self) -> int:
        slots = self.layers if self.slots is None else self.slots
        return self.block_size * slots * self.bytes_per_token_layer

    def blocks(self, pool_bytes: int) -> int:
        return max(0, pool_bytes // self.block_bytes) if self.block_bytes else 0

    def _sliding_blocks(self, length: int, step_tokens: int) -> int:
        if not (self.sliding_groups and self.window):
            return 0
        kept = min(self.window - 1 + step_tokens, length)
        return self.sliding_groups * (math.ceil(kept / self.block_size) + 1)

    def sequence_bytes(self, length: int, step_tokens: int) -> int:
        """KV one sequence of `length` tokens needs (vLLM's max_memory_usage_bytes)."""
        blocks = self.full_groups * math.ceil(length / self.block_size) + self._sliding_blocks(length, step_tokens)
        return blocks * self.block_bytes

    def max_length(self, pool_bytes: int, step_tokens: int) -> int:
        """The longest single sequence the pool holds, in whole blocks (0: none)."""
        if not self.block_bytes:
            return 0
        usable = pool_bytes // self.block_bytes - self._sliding_blocks(step_tokens + (self.window or 0), step_tokens)
        if self.full_groups == 0:  # only sliding layers: any length fits once the window does
            return UNBOUNDED if usable >= 0 else 0
        return max(0, usable // self.full_groups) * self.block_size


def stage_kv(spec: ModelSpec, tp: int, layers: range, dtype_bytes: int, block_size: int = BLOCK_SIZE) -> StageKV:
    groups = kv_groups(spec)
    attending = [i for i in layers if i in set(attention_layers(spec))]
    sliding = sum(1 for i in attending if groups.windows[groups.group_of(i)] is not None)
    return StageKV(full_layers=len(attending) - sliding, sliding_layers=sliding, window=spec.attention.sliding_window,
                   bytes_per_token_layer=kv_bytes_per_token_per_layer(spec, tp, dtype_bytes), block_size=block_size,
                   slots=len({groups.slot(i) for i in attending}), full_groups=groups.full_groups,
                   sliding_groups=groups.sliding_groups)
