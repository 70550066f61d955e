"""The Triton kernels against their torch references: under the interpreter on CPU tensors in
float32 (TRITON_INTERPRET=1, set by conftest), compiled on a GPU when one is present."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: E402,F401  (a required dependency on Linux: missing, these tests fail, not skip)

from helpers.paged_steps import paged_step as _paged_step  # noqa: E402
from helpers.paths import ROOT
from llmctl.engine.layers.positions import alibi_slopes  # noqa: E402
from llmctl.kernels.attention import (  # noqa: E402
    AttentionOptions,
    kernel_constexprs,
    paged_attention,
    paged_attention_reference,
    plan_step,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16
TOLERANCE = 1e-4 if DTYPE == torch.float32 else 1.5e-2


def paged_step(query_lens: list[int], seq_lens: list[int], **shape):
    return _paged_step(query_lens, seq_lens, dtype=DTYPE, device=DEVICE, **shape)


def check(query_lens, seq_lens, *, heads, kv_heads, dim, block_size, segments=None, pool_blocks=64, key_tile=None,
          **options):
    query, cache, tables, lens, starts = paged_step(query_lens, seq_lens, heads=heads, kv_heads=kv_heads, dim=dim,
                                                    block_size=block_size, pool_blocks=pool_blocks)
    opts = AttentionOptions(scale=dim ** -0.5, **options)
    expected = paged_attention_reference(query, cache, tables, lens, torch.tensor(starts), opts)
    layout = plan_step(starts, heads, kv_heads, query.device, num_segments=segments, preferred_key_tile=key_tile)
    if segments is None and set(query_lens) == {1} and len(seq_lens) * kv_heads < 256:
        assert layout.num_segments > 1  # decodes with few programs split by themselves, whatever their length
    got = paged_attention(query, cache, tables, lens, layout, opts)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("dim", [64, 80, 128])
@pytest.mark.parametrize("group", [1, 3, 4, 5])
def test_mixed_step_of_prefill_chunks_and_decodes(dim, group):
    # a fresh prefill, a chunk on top of cached tokens (5 new of 18), and decodes of several lengths
    check([7, 5, 1, 1, 1], [7, 18, 1, 33, 70], heads=2 * group, kv_heads=2, dim=dim, block_size=16)


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
def test_long_chunk_and_block_sizes(block_size):
    # block size 8: a key tile (16 keys, the smallest tl.dot takes) spans two pages
    check([129, 1], [463, 200], heads=4, kv_heads=1, dim=64, block_size=block_size, pool_blocks=128)
    check([1, 1, 1], [9, 100, 17], heads=4, kv_heads=2, dim=64, block_size=block_size, segments=1)


@pytest.mark.parametrize("segments", [1, 4])
def test_attention_sinks_whole_and_split(segments):
    """gpt-oss's sinks: added where a program ends (one segment) or where the merge joins the segments."""
    sinks = torch.tensor([2.0, -1.0, 0.5, 8.0, -30.0, 0.0, 1.5, 3.0], device=DEVICE)
    check([1, 1, 1], [9, 100, 17], heads=8, kv_heads=2, dim=64, block_size=16, segments=segments, sinks=sinks)
    check([6, 1], [6, 40], heads=8, kv_heads=2, dim=64, block_size=16, sinks=sinks, sliding_window=8)


@pytest.mark.parametrize("segments", [1, 4])
def test_chunked_attention(segments):
    """Llama 4's chunks: a prompt crossing chunk boundaries, decodes at and past them, whole and split."""
    check([1, 1, 1], [16, 100, 17], heads=8, kv_heads=2, dim=64, block_size=16, segments=segments, chunk=16)
    check([40, 1], [40, 70], heads=4, kv_heads=1, dim=64, block_size=16, chunk=24, sliding_window=24)


def test_the_chunk_reference_is_transformers_chunked_mask():
    """The kernels' reference mask against transformers' own chunked causal mask (Llama 4's)."""
    from transformers.masking_utils import chunked_causal_mask_function

    query, cache, tables, lens, starts = paged_step([20], [20], heads=2, kv_heads=2, dim=16, block_size=16)
    values = torch.zeros_like(cache)
    values[..., 1, :, :] = torch.eye(16)[torch.arange(cache.shape[1]) % 16].view(1, -1, 1, 16)  # v = one-hot of slot
    ours = paged_attention_reference(torch.zeros_like(query), values, tables, lens, torch.tensor(starts),
                                     AttentionOptions(scale=1.0, chunk=8))[:, 0]  # uniform weights over seen keys
    allowed = chunked_causal_mask_function(8, torch.zeros(1, dtype=torch.long))
    for q in range(20):
        seen = [k for k in range(20) if allowed(0, 0, torch.tensor(q), torch.tensor(k))]
        expected = torch.zeros(16)
        for k in seen:
            expected[k % 16] += 1 / len(seen)
        torch.testing.assert_close(ours[q].float().cpu(), expected, atol=1e-5, rtol=0)


def test_the_sinks_reference_is_transformers_gpt_oss_attention():
    """The kernels' reference against transformers' eager gpt-oss attention, an independent definition."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    query, cache, tables, lens, starts = paged_step([9], [9], heads=4, kv_heads=2, dim=16, block_size=16)
    sinks = torch.tensor([1.0, -2.0, 4.0, 0.0], device=DEVICE)
    opts = AttentionOptions(scale=0.25, sinks=sinks)
    ours = paged_attention_reference(query, cache, tables, lens, torch.tensor(starts), opts)
    keys = cache[tables[0, 0].long(), :9]  # [9, 2, KVH, D]: the sequence's one page
    module = torch.nn.Module()
    module.num_key_value_groups, module.sinks = 2, torch.nn.Parameter(sinks.to(DTYPE))
    causal = torch.full((9, 9), float("-inf"), device=DEVICE).triu(1)
    theirs, _ = eager_attention_forward(module, query.transpose(0, 1)[None], keys[:, 0].transpose(0, 1)[None],
                                        keys[:, 1].transpose(0, 1)[None], causal[None, None], scaling=0.25)
    torch.testing.assert_close(ours.float(), theirs[0].float(), atol=TOLERANCE, rtol=TOLERANCE)


def test_head_dims_below_sixteen_are_padded():
    check([5, 1], [5, 40], heads=4, kv_heads=2, dim=8, block_size=8)


def test_short_decodes_split_by_shape_leave_segments_empty(monkeypatch):
    """The split is chosen from the batch alone (so a CUDA graph captures it): 3 keys over 16 segments. The
    segments past the context exit at once and write nothing; the merge must not read their scratch, which is
    filled with NaN here (uninitialized memory may hold anything)."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *size, **kw: empty(*size, **kw).fill_(float("nan"))
                        if kw.get("dtype") == torch.float32 else empty(*size, **kw))
    check([1, 1], [3, 1], heads=4, kv_heads=2, dim=64, block_size=16)
    check([1, 1, 1], [40, 1, 17], heads=4, kv_heads=2, dim=64, block_size=16, sliding_window=20)


@pytest.mark.parametrize("segments", [1, 4, None])
def test_long_decodes_split_along_the_context(segments):
    check([1, 1], [2000, 37], heads=4, kv_heads=2, dim=64, block_size=16, segments=segments, pool_blocks=160)


@pytest.mark.parametrize("key_tile,segments", [(32, 16), (64, 64)])
def test_the_decode_tilings_the_gpu_sweep_times(key_tile, segments):
    """benchmarks/kernels.py times decodes in 32- and 64-key tiles and 64 segments besides the engine's
    choice; they must be right before their times can choose (block size 8: a 64-key tile spans 8 pages)."""
    check([1, 1, 1], [400, 37, 64], heads=4, kv_heads=2, dim=64, block_size=8, segments=segments,
          pool_blocks=160, key_tile=key_tile, alibi_slopes=alibi_slopes(4).to(DEVICE), sliding_window=300)
    constexprs = kernel_constexprs(dim=64, block_size=8, group=2, rows=16, segments=segments, decode_only=True,
                                   dtype=DTYPE, kv_fp8=False, window=True, alibi=True, softcap=False,
                                   preferred_key_tile=key_tile)
    assert constexprs["KEY_TILE"] == key_tile  # the kernel really walked in such tiles


def test_a_large_pool():
    # 32,768 blocks: block × stride is computed in int64 (a GPU pool of 80 GB passes 2^31 elements)
    check([3, 1], [20, 50], heads=2, kv_heads=1, dim=64, block_size=16, pool_blocks=32_768)


def test_a_pool_past_two_to_the_thirty_one_elements():
    """A 2.15 GB fp8 pool (2^31 + elements, as an 80 GB GPU's pool is): the step's K/V stored in its last
    blocks and read back through them, so every slot × stride and block × stride must be 64-bit."""
    from llmctl.kernels.kv_store import store_kv

    blocks, block_size, dim, length = 1_050_000, 16, 64, 40
    cache = torch.empty(blocks, block_size, 2, 1, dim, dtype=torch.float8_e4m3fn, device=DEVICE)
    assert cache.numel() > 2**31
    gen = torch.Generator().manual_seed(5)
    tables = torch.tensor([[blocks - 1, blocks - 3, blocks - 2]], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor([int(tables[0, p // block_size]) * block_size + p % block_size for p in range(length)],
                         dtype=torch.int64, device=DEVICE)
    key, value = (torch.randn(length, 1, dim, generator=gen).to(DTYPE).to(DEVICE) for _ in range(2))
    store_kv(key, value, cache, slots)
    stored = cache.view(-1, 2, 1, dim)[slots]
    torch.testing.assert_close(stored[:, 0].float(), key.to(torch.float8_e4m3fn).float())
    query = torch.randn(1, 2, dim, generator=gen).to(DTYPE).to(DEVICE)
    opts, lens = AttentionOptions(scale=dim ** -0.5), torch.tensor([length], dtype=torch.int32, device=DEVICE)
    got = paged_attention(query, cache, tables, lens, plan_step([0, 1], 2, 1, query.device), opts)
    expected = paged_attention_reference(query, cache, tables, lens, torch.tensor([0, 1]), opts)
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE, rtol=TOLERANCE)
    del cache


def test_alibi():
    check([6, 1, 1], [6, 21, 40], heads=6, kv_heads=6, dim=64, block_size=16, alibi_slopes=alibi_slopes(6).to(DEVICE))


def test_sliding_window():
    check([9, 1, 4], [9, 50, 40], heads=4, kv_heads=2, dim=64, block_size=16, sliding_window=8)
    check([1, 1], [1500, 20], heads=4, kv_heads=2, dim=64, block_size=16, sliding_window=100, segments=4,
          pool_blocks=128)


def limits_with_spans(query_lens: list[int], seq_lens: list[int], spans: list[tuple[int, int, int]]) -> torch.Tensor:
    limits = [p for q, n in zip(query_lens, seq_lens) for p in range(n - q, n)]
    starts = [sum(query_lens[:i]) for i in range(len(query_lens))]
    for seq, first, last in spans:
        for position in range(first, last + 1):
            limits[starts[seq] + position - (seq_lens[seq] - query_lens[seq])] = last
    return torch.tensor(limits, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("window", [None, 8])
def test_image_tokens_that_see_each_other_both_ways(window):
    """Gemma 3's images: a run of a chunk's tokens also sees the run's later tokens (a chunk over cached tokens,
    a decode, and a fresh prompt with two runs; with a window shorter than a run)."""
    query_lens, seq_lens = [30, 1, 12], [50, 33, 12]
    limits = limits_with_spans(query_lens, seq_lens, [(0, 25, 37), (2, 1, 4), (2, 6, 10)])
    check(query_lens, seq_lens, heads=4, kv_heads=2, dim=64, block_size=16, key_limits=limits, sliding_window=window)


def test_softcap():
    check([5, 1], [5, 30], heads=4, kv_heads=4, dim=64, block_size=16, softcap=2.0)


@pytest.mark.parametrize("dtype", [DTYPE, torch.float8_e4m3fn, torch.float8_e5m2])
def test_kv_store_writes_slots_and_skips_minus_one(dtype):
    from llmctl.kernels.kv_store import store_kv, store_kv_reference

    gen = torch.Generator().manual_seed(1)
    key, value = (torch.randn(6, 3, 80, generator=gen).to(DTYPE).to(DEVICE) for _ in range(2))
    slots = torch.tensor([5, 17, -1, 0, 63, 40], dtype=torch.int64, device=DEVICE)
    expected = torch.zeros(4, 16, 2, 3, 80, dtype=dtype, device=DEVICE)
    got = expected.clone()
    fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    scales = (0.02, 0.03) if fp8 else (1.0, 1.0)
    store_kv_reference(key, value, expected, slots, *scales)  # torch's own rounding to the format
    store_kv(key, value, got, slots, *scales)
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))  # bit for bit, fp8 included
    if fp8:  # the round trip loses only the format's precision: 3 mantissa bits for e4m3, 2 for e5m2
        back = got.view(-1, 2, 3, 80)[slots[slots >= 0]].float()
        relative = 0.07 if dtype == torch.float8_e4m3fn else 0.13
        torch.testing.assert_close(back[:, 0] * scales[0], key[slots >= 0].float(), atol=0.02 * 8, rtol=relative)
    assert not got.view(-1, 2, 3, 80)[1:5].float().any()  # untouched slots stay as they were


@pytest.mark.parametrize("fp8_dtype,limit", [(torch.float8_e4m3fn, 448), (torch.float8_e5m2, 57344)])
def test_attention_over_an_fp8_cache(fp8_dtype, limit):
    query, cache, tables, lens, starts = paged_step([4, 1], [4, 40], heads=4, kv_heads=2, dim=64, block_size=16)
    fp8 = (cache.float() / 0.05).clamp(-limit, limit).to(fp8_dtype)
    opts = AttentionOptions(scale=0.125, k_scale=0.05, v_scale=0.05)
    expected = paged_attention_reference(query, fp8, tables, lens, torch.tensor(starts), opts)
    got = paged_attention(query, fp8, tables, lens, plan_step(starts, 4, 2, query.device), opts)
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize("method,act_order,bits", [("gptq", False, 4), ("gptq", True, 4), ("awq", False, 4),
                                                   ("gptq", False, 8), ("gptq", True, 8)])
@pytest.mark.parametrize("rows,split_k", [(1, None), (1, 2), (5, 3), (33, None), (300, None)])  # 300: dequantize, GEMM
def test_w4a16_matches_the_unpacked_weights(method, act_order, bits, rows, split_k):
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
    from llmctl.kernels.w4a16 import w4a16_matmul, w4a16_reference

    gen = torch.Generator().manual_seed(2)
    inner, cols, group = 96, 80, 32  # K not a multiple of BLOCK_K · 2, N not of BLOCK_N
    levels = 1 << bits
    weight = QuantizedWeight(q=torch.randint(0, levels, (cols, inner), generator=gen, dtype=torch.int32),
                             scales=(torch.rand(cols, inner // group, generator=gen) / levels + 0.001).half().float(),
                             zeros=torch.randint(1, levels, (cols, inner // group), generator=gen, dtype=torch.int32),
                             bits=bits, group_size=group)
    packed = pack_gptq(weight) if method == "gptq" else pack_awq(weight)
    g_idx = packed.get("g_idx")
    if act_order:  # desc_act: each input row's group as a permutation gives it
        g_idx = g_idx[torch.randperm(inner, generator=gen)].contiguous()
    x = torch.randn(rows, inner, generator=gen).to(DTYPE)
    args = [packed[k].to(DEVICE) for k in ("qweight", "qzeros", "scales")]
    g_idx = g_idx.to(DEVICE) if g_idx is not None else None
    expected = w4a16_reference(x.to(DEVICE), method, *args, g_idx, group, bits)
    got = w4a16_matmul(x.to(DEVICE), method, *args, g_idx, group, split_k=split_k, bits=bits)  # K split: summed
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE * 10, rtol=TOLERANCE * 10)
    if not act_order:  # and the reference, in float32, multiplies by the weight we packed
        reference = w4a16_reference(x.float(), method, *(packed[k] for k in ("qweight", "qzeros", "scales")), None, group,
                                    bits)
        torch.testing.assert_close(reference, x.float() @ weight.dequantize().t(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method,bits", [("gptq", 4), ("awq", 4), ("gptq", 8)])
@pytest.mark.parametrize("rows,group,tiles", [
    (1, 32, None), (1, 128, None),  # the engine's choice
    (1, 128, (32, 128, 1)), (3, 64, (16, 32, 3)), (2, 64, (64, 64, 4)),  # one K share; K shares of odd sizes
    (2, 64, (64, 64, 4, 4, 3)),  # the K loop pipelined three tiles deep (on a GPU; the interpreter runs it in turn)
    (1, 64, (32, 64, 4, 4, 1, "last")), (2, 32, (16, 32, 3, 4, 2, "last")),  # the last split program sums them
])
def test_w4a16_gemv_matches_the_unpacked_weights(method, bits, rows, group, tiles):
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
    from llmctl.kernels.w4a16 import w4a16_matmul
    from llmctl.kernels.w4a16_gemv import GemvTiles, gemv_applies, w4a16_gemv

    gen = torch.Generator().manual_seed(rows + group)
    inner, cols, levels = 384, 72, 1 << bits  # N not a multiple of any block; K of 3 tiles of 128
    weight = QuantizedWeight(q=torch.randint(0, levels, (cols, inner), generator=gen, dtype=torch.int32),
                             scales=(torch.rand(cols, inner // group, generator=gen) / levels + 0.001).half().float(),
                             zeros=torch.randint(1, levels, (cols, inner // group), generator=gen, dtype=torch.int32),
                             bits=bits, group_size=group)
    packed = pack_gptq(weight) if method == "gptq" else pack_awq(weight)
    args = [packed[k].to(DEVICE) for k in ("qweight", "qzeros", "scales")]
    x = torch.randn(rows, inner, generator=gen).to(DTYPE)
    expected = x.float() @ weight.dequantize().t()  # torch's own dequantization, independent of the packing
    if tiles is None:
        assert gemv_applies(rows, group, act_order=False)
        got = w4a16_matmul(x.to(DEVICE), method, *args, None, group, bits=bits)  # what a decode step calls
    else:
        got = w4a16_gemv(x.to(DEVICE), method, *args, group, bits, GemvTiles(*tiles))
    assert got.dtype == DTYPE and got.shape == (rows, cols)
    torch.testing.assert_close(got.float().cpu(), expected, atol=TOLERANCE * 10, rtol=TOLERANCE * 10)


def test_the_last_split_program_leaves_its_counts_at_zero_and_sums_alike_every_call():
    """`split_sum="last"`: the finish counts must be zero again after a call (the next call's last program
    is found by them), and the partials are added in split order, so every call gives the same bits."""
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_gptq
    from llmctl.kernels.w4a16_gemv import GemvTiles, split_workspace, w4a16_gemv

    gen = torch.Generator().manual_seed(7)
    weight = QuantizedWeight(q=torch.randint(0, 16, (64, 256), generator=gen, dtype=torch.int32),
                             scales=torch.rand(64, 4, generator=gen) / 16 + 0.001, bits=4, group_size=64,
                             zeros=torch.randint(1, 16, (64, 4), generator=gen, dtype=torch.int32))
    packed = pack_gptq(weight)
    args = [packed[k].to(DEVICE) for k in ("qweight", "qzeros", "scales")]
    x = torch.randn(1, 256, generator=gen).to(DTYPE).to(DEVICE)
    tiles = GemvTiles(32, 64, 4, split_sum="last")
    first, *again = [w4a16_gemv(x, "gptq", *args, 64, 4, tiles) for _ in range(3)]
    counts = split_workspace(x.device, 4, 1, 64, 2)[1]
    assert counts.shape == (2,) and not counts.any()
    assert all(torch.equal(first, other) for other in again)
    torch.testing.assert_close(first.float().cpu(), x.float().cpu() @ weight.dequantize().t(),
                               atol=TOLERANCE * 10, rtol=TOLERANCE * 10)


def test_w4a16_gemv_leaves_act_order_and_larger_steps_to_the_tensor_core_kernel():
    from llmctl.kernels.w4a16_gemv import GEMV_MAX_ROWS, choose_gemv_tiles, gemv_applies

    assert gemv_applies(GEMV_MAX_ROWS, 128, act_order=False)
    assert not gemv_applies(GEMV_MAX_ROWS + 1, 128, act_order=False)
    assert not gemv_applies(1, 128, act_order=True)
    # split K fills a GPU's multiprocessors (132 on an H100) from the shapes alone, never past 16 shares
    assert choose_gemv_tiles(1, 14336, 4096, 128, False, 132).split_k == 16
    assert choose_gemv_tiles(1, 4096, 14336, 128, False, 132).split_k == 8  # 112 column tiles × 8 ≥ 4 × 132
    assert choose_gemv_tiles(1, 4096, 151936, 128, True, 132).split_k == 1
    assert choose_gemv_tiles(1, 4096, 14336, 64, False, 1).block_k == 64


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantized_linear_through_the_kernel_equals_torch_dequantization(method):
    """What a CUDA forward runs (fused parts, bias) against the CPU path, on the same layer."""
    from llmctl.checkpoint.quant_formats import QuantizedWeight, pack_awq, pack_gptq
    from llmctl.engine.layers.quant_linear import QuantLinear

    gen = torch.Generator().manual_seed(3)
    parts = []
    for cols in (48, 32):  # a fused projection: two linears' packed outputs side by side
        weight = QuantizedWeight(q=torch.randint(0, 16, (cols, 64), generator=gen, dtype=torch.int32),
                                 scales=torch.rand(cols, 2, generator=gen) / 10, bits=4, group_size=32,
                                 zeros=torch.randint(1, 16, (cols, 2), generator=gen, dtype=torch.int32))
        parts.append(pack_gptq(weight) if method == "gptq" else pack_awq(weight))
    layer = QuantLinear(64, 80, bias=True, method=method, bits=4, group_size=32)
    layer.load_parts(parts)
    layer.bias.data.normal_(generator=gen)
    x = torch.randn(2, 3, 64, generator=gen)
    expected = layer(x)  # torch's dequantization, on the CPU
    got = layer.to(DEVICE).forward_w4a16(x.to(DEVICE))  # float32: full-precision products on a GPU too
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("script", ["kernels.py", "w4a16_tiles.py", "w4a16_gemv.py", "gpu_step_profile.py"])
def test_the_gpu_benchmarks_run(script, tmp_path):
    """The scripts scripts/gpu-check.sh runs on a lent GPU work before one is lent: tiny shapes, interpreted."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--tiny", "--json", str(tmp_path / "f")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "WRONG" not in done.stdout and json.loads((tmp_path / "f").read_text())
