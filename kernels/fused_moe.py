"""Fused mixture-of-experts GEMMs for GPUs, as vLLM's `fused_moe`: the (token, expert) pairs sorted by
expert and padded to whole row blocks, so that one launch multiplies every expert's rows by its own
weight — a grouped GEMM over the permutation, no loop over experts on the host.

    h = x[pair // top_k] @ w13[expert]ᵀ (+ b13[expert])        (launch 1: gate and up of every pair)
    y = (act(h) @ w2[expert]ᵀ (+ b2[expert])) · weight          (launch 2: down, scaled by the routing weight)
    out[token] = Σ_k y[token · top_k + k]

act is SiLU-gated by default, or the family's own (gpt-oss's clamped SwiGLU); the biases are gpt-oss's. Llama 4
weighs each expert's input, not its output (`scale_inputs`): with no bias the first projection is linear, so its
output is scaled in launch 1 instead.

The expert weights are the model's dtype, or gpt-oss's MXFP4 as published (`Mxfp4Weights`: two E2M1 codes a
byte, one E8M0 exponent per 32 inputs, 4.25 bits a weight), decoded in registers tile by tile.

`align_pairs` does the sorting with tensor ops only (no host synchronisation): rows padded per expert
to `block_m`, each row block's expert, and the padded total the kernel stops at. Pairs whose expert
is not on this rank (expert parallelism) carry the id `num_experts` and are never computed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from llmctl.kernels.attention import dot_precision
from llmctl.kernels.torch_ops import define


@dataclass(frozen=True)
class Mxfp4Weights:
    """An expert stack in MXFP4: blocks uint8 [E, N, K / 32, 16] (the low nibble first), scales uint8 [E, N, K / 32]
    (2^(byte − 127)) — N outputs, K inputs, as gpt-oss's checkpoints store them."""

    blocks: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        experts, rows, groups, _ = self.blocks.shape
        return experts, rows, groups * 32


ExpertStack = torch.Tensor | Mxfp4Weights  # [E, N, K]


def _operands(weights: ExpertStack) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What the launch reads: the weights [E, N, K] and no scales, or MXFP4's bytes [E, N, K / 2] and scales."""
    if isinstance(weights, Mxfp4Weights):
        return weights.blocks.flatten(2), weights.scales
    return weights, None


@dataclass(frozen=True)
class MoETiles:
    block_m: int
    block_n: int
    block_k: int


def choose_moe_tiles(pairs: int, num_experts: int, element_bytes: int) -> MoETiles:
    """Decode-sized batches (few pairs per expert) take 16-row blocks; float32 K tiles of at most 32
    keep a program inside sm_89's shared memory."""
    per_expert = max(1, pairs // max(1, num_experts))
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64
    return MoETiles(block_m, 64, 64 if element_bytes <= 2 else 32)


def moe_constexprs(tiles: MoETiles, weighted: bool, dtype: torch.dtype, biased: bool = False,
                   mxfp4: bool = False) -> dict:
    """The kernel's compile-time parameters (shared with `llmctl.kernels.compile_check`)."""
    return dict(MUL_WEIGHT=weighted, HAS_BIAS=biased, MXFP4=mxfp4, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                BLOCK_K=tiles.block_k, DOT_PRECISION=dot_precision(dtype))


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [T, k] (outside 0..num_experts-1: not on this rank) -> sorted pair ids padded per expert (padding
    = T·k), the expert of each block of `block_m` rows, and the padded total [1]."""
    flat = ids.flatten().long()
    flat = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)  # the bucket computed elsewhere
    pairs = flat.numel()
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    # scatter_add, not bincount: on CUDA bincount reads the largest id on the host, which a graph cannot capture
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat))[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    start = torch.cumsum(counts, 0) - counts
    capacity = pairs + num_experts * (block_m - 1)  # every expert's last block partly empty, at most
    capacity = (capacity + block_m - 1) // block_m * block_m
    # No boolean masks (their sizes need the host): pairs not here go to one spare slot past the end.
    expert = experts_sorted.clamp(max=num_experts - 1)
    slot = (padded_end - padded)[expert] + torch.arange(pairs, device=ids.device) - start[expert]
    slot = torch.where(experts_sorted < num_experts, slot, capacity)
    sorted_ids = torch.full((capacity + 1,), pairs, dtype=torch.int32, device=ids.device)
    sorted_ids[slot] = order.to(torch.int32)
    sorted_ids = sorted_ids[:capacity]
    block_starts = torch.arange(0, capacity, block_m, device=ids.device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True).to(torch.int32)
    return sorted_ids, block_expert, padded_end[-1:].to(torch.int32)


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: ExpertStack, w2: ExpertStack,
              first_expert: int = 0, quantize: Callable[[torch.Tensor], torch.Tensor] | None = None,
              biases: tuple[torch.Tensor, torch.Tensor | None] | None = None,
              activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
              scale_inputs: bool = False) -> torch.Tensor:
    """Σ_k weight_k · expert_k(x): [T, H] -> [T, H], over this rank's experts (w13[i] is expert first_expert + i);
    `quantize`: what each projection's input goes through first, per row (a checkpoint's per-token scheme);
    `biases`: (b13 [E, 2I], b2 [E, H] or None where another rank adds it); `activation`: [pairs, 2I] -> [pairs, I]
    (SiLU-gated when None); `scale_inputs`: the routing weight on the expert's input (no biases then)."""
    if quantize is not None:
        x = quantize(x)
    tokens, top_k = ids.shape
    experts, intermediate = w13.shape[0], w2.shape[2]
    tiles = choose_moe_tiles(tokens * top_k, experts, x.element_size())
    sorted_ids, block_expert, total = align_pairs(ids - first_expert, experts, tiles.block_m)
    routing = weights.flatten().float().contiguous()
    b13, b2 = biases if biases is not None else (None, None)
    gate_up = torch.empty(tokens * top_k, 2 * intermediate, dtype=x.dtype, device=x.device)
    sizes = (tiles.block_m, tiles.block_n, tiles.block_k)
    b, scales = _operands(w13)
    torch.ops.llmctl.moe_gemm.default(x, b, gate_up, routing if scale_inputs else None, b13, sorted_ids,
                                      block_expert, total, top_k, *sizes, scales)
    if activation is not None:
        hidden = activation(gate_up)
    else:
        hidden = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
    if quantize is not None:
        hidden = quantize(hidden)  # each (token, expert) row: per token, as each expert's own linear would
    down = torch.zeros(tokens * top_k, w2.shape[1], dtype=x.dtype, device=x.device)  # pairs not here stay 0
    b, scales = _operands(w2)
    torch.ops.llmctl.moe_gemm.default(hidden, b, down, None if scale_inputs else routing, b2, sorted_ids,
                                      block_expert, total, 1, *sizes, scales)
    return down.view(tokens, top_k, -1).sum(dim=1)


def _launch(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, routing: torch.Tensor | None,
            bias: torch.Tensor | None, sorted_ids: torch.Tensor, block_expert: torch.Tensor, total: torch.Tensor,
            rows_per_token: int, block_m: int, block_n: int, block_k: int, scales: torch.Tensor | None = None
            ) -> None:
    """One grouped GEMM over the sorted pairs into `out` (the registered op `llmctl::moe_gemm`): bias [E, N]
    added to each pair's row, then the routing weight applied; `scales`: b is MXFP4's bytes [E, N, K / 2]."""
    tiles = MoETiles(block_m, block_n, block_k)
    n, k = b.shape[1], b.shape[2] * (2 if scales is not None else 1)
    grid = (sorted_ids.numel() // tiles.block_m, triton.cdiv(n, tiles.block_n))
    bias = bias.contiguous() if bias is not None else None
    scale_strides = (scales.stride(0), scales.stride(1)) if scales is not None else (0, 0)
    _fused_moe_kernel[grid](
        a, b, out, routing if routing is not None else out, bias if bias is not None else out,
        scales if scales is not None else b, sorted_ids, block_expert, total, n, k, out.shape[0], rows_per_token,
        a.stride(0), b.stride(0), b.stride(1), *scale_strides, out.stride(0),
        **moe_constexprs(tiles, routing is not None, a.dtype, bias is not None, scales is not None))


def _launch_fake(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, routing: torch.Tensor | None,
                 bias: torch.Tensor | None, sorted_ids: torch.Tensor, block_expert: torch.Tensor, total: torch.Tensor,
                 rows_per_token: int, block_m: int, block_n: int, block_k: int, scales: torch.Tensor | None = None
                 ) -> None:
    """A trace's stand-in: `out` is written in place, nothing is returned."""


define("moe_gemm(Tensor a, Tensor b, Tensor(a!) out, Tensor? routing, Tensor? bias, Tensor sorted_ids, "
       "Tensor block_expert, Tensor total, int rows_per_token, int block_m, int block_n, int block_k, "
       "Tensor? scales=None) -> ()", _launch, _launch_fake)


@triton.jit
def _fused_moe_kernel(a_ptr, b_ptr, out_ptr, routing_ptr, bias_ptr, scales_ptr, sorted_ids_ptr, block_expert_ptr,
                      total_ptr, N, K, num_pairs, rows_per_token, stride_a, stride_be, stride_bn, stride_se, stride_sn,
                      stride_out, MUL_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, MXFP4: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return  # past the last expert's padded rows
    pair = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < num_pairs
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = (pair // rows_per_token).to(tl.int64)  # launch 1 reads each token's row for its k pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        inner = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_a + inner[None, :], mask=valid[:, None] & (inner < K)[None, :],
                    other=0.0)
        if MXFP4:
            b = _mxfp4_tile(b_ptr + expert * stride_be, scales_ptr + expert * stride_se, cols, inner, stride_bn,
                            stride_sn, N, K).to(a.dtype)
        else:
            b = tl.load(b_ptr + expert * stride_be + cols[None, :].to(tl.int64) * stride_bn + inner[:, None],
                        mask=(inner < K)[:, None] & (cols < N)[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * N + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if MUL_WEIGHT:
        acc = acc * tl.load(routing_ptr + pair, mask=valid, other=0.0)[:, None]
    tl.store(out_ptr + pair[:, None].to(tl.int64) * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=valid[:, None] & (cols < N)[None, :])


@triton.jit
def _mxfp4_tile(blocks_ptr, scales_ptr, cols, inner, stride_bn, stride_sn, N, K):
    """W[col, inner] as a [BLOCK_K, BLOCK_N] float32 tile, from one expert's MXFP4 bytes and exponents: E2M1 codes
    (sign, two exponent bits, one mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^(scale − 127)."""
    ok = (inner < K)[:, None] & (cols < N)[None, :]
    rows = cols[None, :].to(tl.int64)
    byte = tl.load(blocks_ptr + rows * stride_bn + (inner // 2)[:, None], mask=ok, other=0).to(tl.int32)
    code = (byte >> ((inner % 2) * 4)[:, None]) & 0xF
    exponent = (code >> 1) & 3
    mantissa = (code & 1).to(tl.float32) * 0.5
    magnitude = tl.where(exponent == 0, mantissa, (1.0 + mantissa) * tl.exp2(exponent.to(tl.float32) - 1.0))
    scale = tl.load(scales_ptr + rows * stride_sn + (inner // 32)[:, None], mask=ok, other=127).to(tl.float32)
    return tl.where(code >= 8, -magnitude, magnitude) * tl.exp2(scale - 127.0)
