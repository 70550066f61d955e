"""Per-GPU memory budget: total · utilization − weights − activations − runtime → KV pool.

The engine sizes its KV pool with `kv_pool_bytes` from measured weights and activation
peak; `llmctl plan` calls it with the estimates below. One formula, two callers.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.units import GiB
from llmctl.checkpoint.spec import ModelSpec
from llmctl.plan.kv import StageKV

# Runtime memory that is neither weights, activations nor KV (documented in docs/plan.md).
CUDA_CONTEXT_BYTES = int(0.5 * GiB)  # CUDA context, cuBLAS/cuDNN workspaces
COMMUNICATION_BYTES = int(1.0 * GiB)  # NCCL and custom all-reduce buffers, when TP·PP > 1
CUDA_GRAPH_BYTES = int(0.5 * GiB)  # captured decode graphs, unless --enforce-eager
LOGITS_BYTES = 4  # logits are float32 in the sampler
SAMPLER_COPIES = 2  # logits + probabilities alive at once
# The tensors named below are not all the allocator holds (rotary caches, fragmentation,
# temporaries): vLLM measured 1.26 GiB for Llama-3-8B at 8192 tokens where they sum to
# 0.84 GiB, so the estimate is scaled by this factor.
ACTIVATION_ALLOCATOR_FACTOR = 1.5


@dataclass(frozen=True)
class ActivationShape:
    """What one forward step of `tokens` tokens on one TP rank materializes."""

    tokens: int
    sequences: int
    tp: int
    dtype_bytes: int
    last_stage: bool


def activation_peak_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """Peak transient memory of a forward pass over `shape.tokens` tokens (documented estimate).

    Hidden state and residual stay alive through the layer; on top of them the larger of
    the attention block (QKV + attention output + o_proj output) and the MLP block
    (gate/up + activation + down output) is alive; the last stage also holds float32
    logits and probabilities for every sampled sequence over the full vocabulary.
    """
    t, b, tp, h = shape.tokens, shape.dtype_bytes, shape.tp, spec.hidden_size
    att = spec.attention
    heads = att.num_heads // tp
    if att.kind == "MLA":
        q = heads * ((att.qk_nope_head_dim or 0) + (att.qk_rope_head_dim or 0))
        kv = heads * ((att.qk_nope_head_dim or 0) + (att.v_head_dim or 0))
        attention = t * (2 * q + kv + h) * b
    else:
        q = heads * att.head_dim
        kv = max(1, att.num_kv_heads // tp) * att.head_dim
        attention = t * (2 * q + 2 * kv + h) * b
    attention += _score_bytes(spec, shape)
    mlp = _mlp_activation_bytes(spec, shape)
    resident = 2 * t * h * b
    peak = resident + max(attention, mlp)
    if shape.last_stage:
        logits = SAMPLER_COPIES * shape.sequences * spec.vocab_size * LOGITS_BYTES
        peak = max(peak, resident + logits)
    return int(peak * ACTIVATION_ALLOCATOR_FACTOR)


def _score_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """ALiBi backends (SDPA with a bias) materialize a score matrix per head for the longest
    prefill chunk; FlashAttention-style kernels for RoPE models do not."""
    if spec.positional.kind != "alibi":
        return 0
    heads = spec.attention.num_heads // shape.tp
    chunk = min(shape.tokens, spec.max_context)
    return heads * chunk * chunk * 4


def _mlp_activation_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    t, b, tp, h, moe = shape.tokens, shape.dtype_bytes, shape.tp, spec.hidden_size, spec.moe
    factor = 3 if spec.layout.gated_mlp else 2  # gate+up then act, or fc1 then act
    dense = t * factor * (spec.intermediate_size // tp) * b + t * h * b
    if moe is None:
        return dense
    routed = t * moe.top_k
    experts = routed * factor * max(1, moe.expert_intermediate_size // tp) * b
    return max(dense if moe.dense_layers else 0, experts + t * moe.num_experts * 4 + 2 * t * h * b)


def runtime_overhead_bytes(tp: int, pp: int, enforce_eager: bool = False) -> int:
    overhead = CUDA_CONTEXT_BYTES
    if tp * pp > 1:
        overhead += COMMUNICATION_BYTES
    if not enforce_eager:
        overhead += CUDA_GRAPH_BYTES
    return overhead


@dataclass(frozen=True)
class MemoryBudget:
    """One GPU's memory, vLLM's way: what is left after weights and non-KV memory is KV."""

    total_bytes: int
    utilization: float
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int

    @property
    def usable_bytes(self) -> int:
        return int(self.total_bytes * self.utilization)

    @property
    def non_kv_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + self.overhead_bytes

    @property
    def kv_bytes(self) -> int:
        """Negative when weights and activations alone exceed the budget."""
        return self.usable_bytes - self.non_kv_bytes


@dataclass(frozen=True)
class KVPool:
    available_bytes: int  # memory left for the KV cache
    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def allocated_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block


def kv_pool(available_bytes: int, stage: StageKV) -> KVPool:
    """Whole blocks of `stage.block_size` tokens that fit in the available bytes."""
    blocks = stage.blocks(max(0, available_bytes))
    return KVPool(available_bytes=available_bytes, num_blocks=blocks, block_size=stage.block_size,
                  bytes_per_block=stage.block_bytes)


def max_concurrency(pool: KVPool, stage: StageKV, max_model_len: int, step_tokens: int) -> float:
    """vLLM's "Maximum concurrency for N tokens per request": pool ÷ one full-length request."""
    need = stage.sequence_bytes(max_model_len, step_tokens)
    return pool.allocated_bytes / need if need else 0.0
