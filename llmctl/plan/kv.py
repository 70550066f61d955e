"""KV cache bytes per token and per sequence on one GPU, as vLLM allocates them.

A block holds ``block_size`` tokens of every layer a GPU runs. Full-attention layers keep
every token of a sequence; sliding-window layers keep at most the window (plus the tokens
of one scheduled step). MLA (DeepSeek) stores one compressed latent per token and layer,
the same on every TP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.errors import LlmctlError
from llmctl.checkpoint.spec import ModelSpec
from llmctl.plan.weights import kv_heads_per_rank

BLOCK_SIZE = 16
UNBOUNDED = 2**62  # a max length that no context reaches
KV_CACHE_DTYPES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4}


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """`--kv-cache-dtype auto` stores K/V in the model's dtype."""
    name = kv_cache_dtype.lower()
    if name == "auto":
        return model_dtype_bytes
    if name not in KV_CACHE_DTYPES:
        raise LlmctlError(f"unknown --kv-cache-dtype {kv_cache_dtype!r}; choose auto or fp8")
    return KV_CACHE_DTYPES[name]


def kv_bytes_per_token_per_layer(spec: ModelSpec, tp: int, dtype_bytes: int) -> int:
    return spec.kv_bytes_per_token_layer(dtype_bytes, kv_heads_per_rank(spec, tp))


@dataclass(frozen=True)
class StageKV:
    """KV geometry of one GPU of one pipeline stage."""

    full_layers: int
    sliding_layers: int
    window: int | None
    bytes_per_token_layer: int
    block_size: int = BLOCK_SIZE

    @property
    def layers(self) -> int:
        return self.full_layers + self.sliding_layers

    @property
    def bytes_per_token(self) -> int:
        """All layers on this GPU, one token: 2 · layers · kv_heads/TP · head_dim · dtype bytes."""
        return self.layers * self.bytes_per_token_layer

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    def blocks(self, pool_bytes: int) -> int:
        return max(0, pool_bytes // self.block_bytes) if self.block_bytes else 0

    @property
    def _page_bytes(self) -> int:
        return self.block_size * self.bytes_per_token_layer

    def _sliding_bytes(self, length: int, step_tokens: int) -> int:
        if not (self.sliding_layers and self.window):
            return 0
        kept = min(self.window - 1 + step_tokens, length)
        return self.sliding_layers * (math.ceil(kept / self.block_size) + 1) * self._page_bytes

    def sequence_bytes(self, length: int, step_tokens: int) -> int:
        """KV one sequence of `length` tokens needs (vLLM's max_memory_usage_bytes)."""
        full = self.full_layers * math.ceil(length / self.block_size) * self._page_bytes
        return full + self._sliding_bytes(length, step_tokens)

    def max_length(self, pool_bytes: int, step_tokens: int) -> int:
        """The longest single sequence the pool holds, in whole blocks (0: none)."""
        if not self.bytes_per_token:
            return 0
        usable = pool_bytes - self._sliding_bytes(step_tokens + (self.window or 0), step_tokens)
        if self.full_layers == 0:  # only sliding layers: any length fits once the window does
            return UNBOUNDED if usable >= 0 else 0
        return max(0, usable // (self.full_layers * self._page_bytes)) * self.block_size


def stage_kv(spec: ModelSpec, tp: int, layers: range, dtype_bytes: int, block_size: int = BLOCK_SIZE) -> StageKV:
    kinds = spec.attention.layer_types
    window = spec.attention.sliding_window
    sliding = sum(1 for i in layers if i < len(kinds) and kinds[i] == "sliding") if window else 0
    return StageKV(full_layers=len(layers) - sliding, sliding_layers=sliding, window=window,
                   bytes_per_token_layer=kv_bytes_per_token_per_layer(spec, tp, dtype_bytes), block_size=block_size)
