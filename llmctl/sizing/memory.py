"""Per-GPU memory budget: total · utilization − weights − activations − runtime → KV pool.

The engine sizes its KV pool with `kv_pool_bytes` from measured weights and activation
peak; `llmctl plan` calls it with the estimates below. One formula, two callers.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.checkpoint.spec import ModelSpec
from llmctl.sizing.kv import StageKV
from llmctl.units import GiB

# Memory vLLM subtracts beside weights and activations: what its profiler sees allocated
# outside PyTorch while profiling (cuBLAS workspaces; NCCL buffers once ranks talk). Its
# startup logs show 0.01–0.12 GiB on one GPU and 0.20–0.43 GiB per rank with TP > 1. The CUDA
# context predates vLLM's baseline and CUDA graphs are captured after the KV pool is sized, so
# vLLM takes neither from the budget: both live in the 1 − utilization headroom.
NON_TORCH_BYTES = int(0.1 * GiB)
NON_TORCH_DISTRIBUTED_BYTES = int(0.3 * GiB)
LOGITS_BYTES = 4  # the sampler works on float32 logits


@dataclass(frozen=True)
class ActivationShape:
    """vLLM's profiling step: `tokens` tokens split over `sequences` prompts, one TP rank."""

    tokens: int
    sequences: int
    tp: int
    dtype_bytes: int
    last_stage: bool


def activation_peak_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """vLLM's "PyTorch activation peak memory" of its profiling step (docs/plan.md).

    The larger of the forward pass (hidden state and residual, plus the larger of the
    attention and MLP blocks) and, on the last stage, the sampler's top-k/top-p pass over
    one row of logits per sequence, while the final hidden states are still held.
    """
    resident = 2 * shape.tokens * spec.hidden_size * shape.dtype_bytes
    forward = resident + max(_attention_bytes(spec, shape), _mlp_activation_bytes(spec, shape))
    if not shape.last_stage:
        return forward
    hidden = shape.tokens * spec.hidden_size * shape.dtype_bytes
    return max(forward, hidden + sampler_peak_bytes(spec.vocab_size, min(shape.sequences, shape.tokens),
                                                   shape.dtype_bytes))


def sampler_peak_bytes(vocab_size: int, rows: int, dtype_bytes: int) -> int:
    """Tensors alive at the end of vLLM's torch top-k/top-p pass (`_apply_top_k_top_p`), which
    its profiling run exercises with top_k = vocab − 1 and top_p = 0.99, per logits entry:
    the model-dtype logits; float32 logits, sorted logits, sorted probabilities, their
    cumulative sum and the logits put back in order (5 × 4 bytes); the sort indices and their
    inverse (2 × 8 bytes); the top-k and top-p masks (2 × 1 byte)."""
    per_entry = dtype_bytes + 5 * LOGITS_BYTES + 2 * 8 + 2 * 1
    return rows * vocab_size * per_entry


def _attention_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """QKV projection output, attention output and o_proj output."""
    t, b, tp, h = shape.tokens, shape.dtype_bytes, shape.tp, spec.hidden_size
    att = spec.attention
    heads = att.num_heads // tp
    if att.kind == "MLA":
        q = heads * ((att.qk_nope_head_dim or 0) + (att.qk_rope_head_dim or 0))
        kv = heads * ((att.qk_nope_head_dim or 0) + (att.v_head_dim or 0))
        return t * (2 * q + kv + h) * b + _score_bytes(spec, shape)
    q = heads * att.head_dim
    kv = max(1, att.num_kv_heads // tp) * att.head_dim
    return t * (2 * q + 2 * kv + h) * b + _score_bytes(spec, shape)


def _score_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """ALiBi backends (SDPA with a bias) materialize a score matrix per head for the longest
    prefill chunk; FlashAttention-style kernels for RoPE models do not."""
    if spec.positional.kind != "alibi":
        return 0
    heads = spec.attention.num_heads // shape.tp
    chunk = min(shape.tokens, spec.max_context)
    return heads * chunk * chunk * 4


def _mlp_activation_bytes(spec: ModelSpec, shape: ActivationShape) -> int:
    """gate+up output, the activation and the down output are alive together (vLLM's MLP
    keeps gate_up referenced through down_proj)."""
    t, b, tp, h, moe = shape.tokens, shape.dtype_bytes, shape.tp, spec.hidden_size, spec.moe
    factor = 3 if spec.layout.gated_mlp else 2  # gate+up then act, or fc1 then act
    dense = t * factor * (spec.intermediate_size // tp) * b + t * h * b
    if moe is None:
        return dense
    routed = t * moe.top_k
    experts = routed * factor * max(1, moe.expert_intermediate_size // tp) * b
    return max(dense if moe.dense_layers else 0, experts + t * moe.num_experts * 4 + 2 * t * h * b)


def runtime_overhead_bytes(tp: int, pp: int) -> int:
    """The non-torch memory vLLM's profiler subtracts (see NON_TORCH_BYTES)."""
    return NON_TORCH_DISTRIBUTED_BYTES if tp * pp > 1 else NON_TORCH_BYTES


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


def state_slots(available_bytes: int, state_bytes: int, sequence_kv_bytes: int, max_num_seqs: int) -> int:
    """Recurrent layers (Mamba2): how many sequences get a state slot — --max-num-seqs, or as many as fit in the
    budget beside one full-length sequence's KV, and in at most half of it where attention layers need KV too (the
    other half left to the KV pool, which short sequences share)."""
    if not state_bytes:  # no recurrent layer here (a pipeline stage of attention layers): no limit of its own
        return max_num_seqs
    budget = available_bytes - sequence_kv_bytes
    if sequence_kv_bytes:
        budget = min(budget, available_bytes // 2)
    return max(0, min(max_num_seqs, budget // state_bytes))
