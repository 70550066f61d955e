"""The C++ CPU kernels (kernels/cpu_*.cpp, built by llmctl.kernels.cpu) against their torch
references: paged attention and the KV store, the fused RMSNorm and rotary layers, the AVX-512
panel GEMM and the packed linears (panels for float32 where the CPU has AVX-512, else oneDNN)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.paged_steps import paged_step
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.positions import _rotate, alibi_slopes
from llmctl.errors import SettingError
from llmctl.kernels import cpu
from llmctl.kernels.attention import AttentionOptions, paged_attention_reference

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.fixture(scope="module", autouse=True)
def built():
    reason = cpu.unavailable_reason()
    assert reason is None, reason  # the machines this project supports all have g++ and ninja


def check(query_lens, seq_lens, *, heads, kv_heads, dim, block_size=16, dtype=torch.float32, pool_blocks=64,
          **options):
    query, cache, tables, lens, starts = paged_step(query_lens, seq_lens, heads=heads, kv_heads=kv_heads, dim=dim,
                                                    block_size=block_size, dtype=dtype, pool_blocks=pool_blocks)
    opts = AttentionOptions(scale=dim ** -0.5, **options)
    expected = paged_attention_reference(query, cache, tables, lens, torch.tensor(starts), opts)
    got = cpu.paged_attention(torch.empty_like(query), query, cache, tables, lens,
                              torch.tensor(starts, dtype=torch.int32), opts.scale, opts.alibi_slopes,
                              opts.sliding_window, opts.softcap, opts.sinks, opts.chunk)
    assert torch.isfinite(got).all()  # never a NaN page past a sequence's end
    torch.testing.assert_close(got.float(), expected.float(), atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dim", [64, 80, 128, 72])  # 72: the runtime-size path
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5])
def test_paged_attention_on_decodes_and_chunks(dim, group):
    # decodes of several lengths, a chunk of 5 new tokens on top of 13 cached, a fresh prefill
    check([1, 5, 1, 1, 7], [1, 18, 33, 70, 7], heads=2 * group, kv_heads=2, dim=dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_with_sinks(dtype):
    """gpt-oss: a logit per head in each softmax's denominator, on its full and 128-token sliding layers."""
    sinks = torch.tensor([2.0, -1.0, 0.5, 8.0, -30.0, 0.0, 1.5, 3.0])
    check([1, 5, 1, 7], [1, 18, 70, 7], heads=8, kv_heads=2, dim=64, dtype=dtype, sinks=sinks)
    check([1, 5, 1, 7], [1, 18, 70, 7], heads=8, kv_heads=2, dim=72, dtype=dtype, sinks=sinks, sliding_window=16)


@pytest.mark.parametrize("dim", [64, 72])
def test_paged_attention_in_chunks(dim):
    """Llama 4: each query sees its own aligned chunk only (chunks of 16 here; one of 7 tokens inside a chunk)."""
    check([1, 5, 1, 37, 1], [1, 18, 70, 37, 33], heads=8, kv_heads=2, dim=dim, chunk=16)
    check([1, 5, 1], [1, 18, 70], heads=4, kv_heads=4, dim=dim, chunk=7, sliding_window=7)


@pytest.mark.parametrize("dim", [64, 80])
def test_paged_attention_items_spanning_several_kv_heads(dim):
    # Enough sequences that each work item takes all KV heads (SmolLM2's 9 query / 3 KV heads).
    query_lens, seq_lens = [1] * 10 + [5, 3], [3 + 29 * i for i in range(10)] + [18, 40]
    check(query_lens, seq_lens, heads=9, kv_heads=3, dim=dim, pool_blocks=128)
    check(query_lens, seq_lens, heads=6, kv_heads=6, dim=dim, pool_blocks=128, alibi_slopes=alibi_slopes(6))
    check(query_lens, seq_lens, heads=8, kv_heads=2, dim=dim, pool_blocks=128, sliding_window=20)


@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_block_sizes_and_long_context(block_size):
    check([1, 16, 1], [463, 200, 1000], heads=4, kv_heads=1, dim=64, block_size=block_size, pool_blocks=128)


@pytest.mark.parametrize("dim", [64, 128])
def test_paged_attention_on_whole_prompts_and_long_chunks(dim):
    # The cpu backend sends prompts of up to VECTOR_QUERY_LIMIT new tokens here: fresh ones
    # (query length = context) and long chunks over cached tokens, next to a decode.
    check([300, 129, 1], [300, 463, 90], heads=9, kv_heads=3, dim=dim, pool_blocks=64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 80, 128, 72])  # 72: the plain loop; the others register rows on AVX-512
def test_paged_attention_half_precision_caches(dtype, dim):
    check([1, 3, 1], [40, 20, 9], heads=6, kv_heads=2, dim=dim, dtype=dtype)
    # a whole prompt and a long chunk (the backend sends these on AVX-512), items spanning KV heads
    check([200, 40, 1] + [1] * 8, [200, 90, 33] + [9 + 20 * i for i in range(8)], heads=9, kv_heads=3, dim=dim,
          dtype=dtype, pool_blocks=128, softcap=0.5 if dim == 80 else 0.0)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 80, 72])  # 72: the plain loop
def test_float32_queries_over_a_half_precision_cache(cache_dtype, dim):
    # --kv-cache-dtype bfloat16/float16 under a float32 model: the cache rows converted as they are read, so the
    # result is the float32 kernel's over the same rounded values, bit for bit, and the reference's over them
    query_lens, seq_lens = [1, 3, 1, 40] + [1] * 6, [40, 20, 9, 40] + [9 + 20 * i for i in range(6)]
    query, cache, tables, lens, starts = paged_step(query_lens, seq_lens, heads=9, kv_heads=3, dim=dim,
                                                    block_size=16, dtype=torch.float32, pool_blocks=128)
    narrow, rounded = cache.to(cache_dtype), cache.to(cache_dtype).float()
    starts = torch.tensor(starts, dtype=torch.int32)
    got = cpu.paged_attention(torch.empty_like(query), query, narrow, tables, lens, starts, dim ** -0.5)
    on_rounded = cpu.paged_attention(torch.empty_like(query), query, rounded, tables, lens, starts, dim ** -0.5)
    assert got.dtype == torch.float32 and torch.equal(got, on_rounded)
    expected = paged_attention_reference(query, rounded, tables, lens, starts, AttentionOptions(scale=dim ** -0.5))
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_a_half_precision_query_over_a_float32_cache_is_refused():
    query, cache, tables, lens, starts = paged_step([1], [5], heads=2, kv_heads=2, dim=64, block_size=16,
                                                    dtype=torch.float32, pool_blocks=4)
    with pytest.raises(RuntimeError, match="bfloat16/float16 under float32 queries"):
        cpu.paged_attention(torch.empty_like(query.half()), query.half(), cache, tables, lens,
                            torch.tensor(starts, dtype=torch.int32), 0.125)


def test_paged_attention_alibi_and_window():
    check([1, 4, 1], [21, 6, 40], heads=6, kv_heads=6, dim=64, alibi_slopes=alibi_slopes(6))
    check([1, 4, 1], [50, 40, 9], heads=4, kv_heads=2, dim=64, sliding_window=8)


@pytest.mark.parametrize("dim", [64, 72])  # the unrolled rows and the runtime-size path
def test_paged_attention_soft_caps_the_scores(dim):
    # Gemma 2's soft-cap, low enough that it bends most scores (its real one is 50), with and without a window
    check([1, 4, 1, 130], [50, 40, 9, 130], heads=4, kv_heads=2, dim=dim, softcap=0.5, pool_blocks=128)
    check([1, 4, 1], [50, 40, 9], heads=4, kv_heads=2, dim=dim, softcap=0.5, sliding_window=8)


@pytest.mark.parametrize("views_of_qkv", [False, True])
def test_store_kv_writes_slots_and_skips_minus_one(views_of_qkv):
    gen = torch.Generator().manual_seed(1)
    if views_of_qkv:  # K and V as the layers pass them: strided views of the fused projection's output
        qkv = torch.randn(6, 9 * 80, generator=gen)
        key, value = (part.view(6, 3, 80) for part in qkv.split([3 * 80, 3 * 80, 3 * 80], dim=1)[1:])
        assert not key.is_contiguous()
    else:
        key, value = (torch.randn(6, 3, 80, generator=gen) for _ in range(2))
    slots = torch.tensor([5, 17, -1, 0, 63, 40])
    got = torch.zeros(4, 16, 2, 3, 80)
    cpu.store_kv(got, slots, key, value)
    flat = got.view(-1, 2, 3, 80)
    kept = slots >= 0
    assert torch.equal(flat[slots[kept], 0], key[kept]) and torch.equal(flat[slots[kept], 1], value[kept])
    assert not flat[1:5].any()  # untouched slots stay as they were


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_store_kv_rounds_float32_rows_into_a_half_precision_cache(cache_dtype):
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(70, 9 * 64, generator=gen) * 3  # 70 tokens: more than one thread's share
    key, value = (part.view(70, 3, 64) for part in qkv.split([3 * 64, 3 * 64, 3 * 64], dim=1)[1:])
    slots = torch.randperm(128, generator=gen)[:70]
    slots[7] = -1
    got = torch.zeros(8, 16, 2, 3, 64, dtype=cache_dtype)
    cpu.store_kv(got, slots, key, value)
    flat, kept = got.view(-1, 2, 3, 64), slots >= 0
    # torch's own conversion (round to nearest even) is the reference
    assert torch.equal(flat[slots[kept], 0], key[kept].to(cache_dtype))
    assert torch.equal(flat[slots[kept], 1], value[kept].to(cache_dtype))
    with pytest.raises(RuntimeError, match="share one dtype"):
        cpu.store_kv(torch.zeros(8, 16, 2, 3, 64), slots, key.half(), value.half())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_and_the_fused_residual_add(dtype):
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = torch.randn(576).to(dtype)
    x, branch = torch.randn(7, 576).to(dtype), torch.randn(7, 576).to(dtype)
    tolerance = dict(atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    torch.testing.assert_close(cpu.rms_norm(x.clone(), norm.weight, 1e-5), norm.reference(x), **tolerance)
    stream = x.clone()
    normed, total = norm.add_and_norm(branch, stream)
    assert total is stream  # the residual stream is updated in place
    torch.testing.assert_close(total, x + branch, atol=0, rtol=0)
    torch.testing.assert_close(normed, norm.reference(x + branch), **tolerance)


@pytest.mark.parametrize("rotary_dim", [64, 32])  # 32: partial rotary, the rest of each head untouched
def test_rotary_in_place_on_strided_heads(rotary_dim):
    qkv = torch.randn(5, 9 * 64 + 2 * 3 * 64)
    query, key = qkv[:, :576].view(5, 9, 64), qkv[:, 576:768].view(5, 3, 64)  # views of the fused QKV output
    cos, sin = torch.randn(5, rotary_dim), torch.randn(5, rotary_dim)
    expected = _rotate(query, cos.unsqueeze(1), sin.unsqueeze(1)), _rotate(key, cos.unsqueeze(1), sin.unsqueeze(1))
    value_before = qkv[:, 768:].clone()
    cpu.rotary(query, key, cos, sin)
    torch.testing.assert_close(query, expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(key, expected[1], atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, 768:], value_before)


@pytest.mark.parametrize("rows", [1, 3, 4, 17, 300])  # below the measured crossover the plain weight runs
def test_packed_linear_equals_the_plain_one(rows):
    plain = nn.Linear(96, 40)
    holder = nn.Sequential(plain)
    assert cpu_gemm.pack_linears(holder) == 96 * 40 * 4
    packed = holder[0]
    assert isinstance(packed, cpu_gemm.PackedLinear) and packed.weight is plain.weight
    x = torch.randn(rows, 96)
    torch.testing.assert_close(packed(x), nn.functional.linear(x, plain.weight, plain.bias), atol=1e-5, rtol=1e-5)


def test_the_packed_kernel_named_is_this_models_not_the_last_ones():
    """The name is a module global: a model with nothing to pack (float16 here; bfloat16 on a CPU without
    AVX512-BF16 whose oneDNN refuses it) reported the previous model's kernel (an AVX2 CI run said "llmctl's
    AVX2 float32 GEMM" for a bfloat16 model)."""
    cpu_gemm.pack_linears(nn.Sequential(nn.Linear(96, 40)))
    assert cpu_gemm.packed_kernel() != cpu_gemm.NOTHING_PACKED
    assert cpu_gemm.pack_linears(nn.Sequential(nn.Linear(96, 40).half())) == 0
    assert cpu_gemm.packed_kernel() == cpu_gemm.NOTHING_PACKED


AVX512 = cpu.panel_linear_supported()


PANEL_ISAS = cpu.panel_isas()


@pytest.mark.parametrize("isa", [pytest.param(isa, marks=pytest.mark.skipif(
    isa not in PANEL_ISAS, reason=f"this CPU has no {isa}")) for isa in ("avx512", "avx2")])
@pytest.mark.parametrize("out_features,in_features", [(5, 7), (40, 96), (960, 576), (576, 1536), (1000, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_panel_linear_equals_f_linear(isa, out_features, in_features, bias):
    torch.manual_seed(out_features)
    weight = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if bias else None
    panels = cpu.pack_panels(weight)
    assert panels.shape == (2 * -(-out_features // 32), in_features, 16)
    # row counts: tiles of 1..8 rows, uneven tiles (9, 13), chunks of 128 and a chunk's tail (129, 300)
    for rows in (1, 2, 3, 5, 8, 9, 13, 32, 128, 129, 300):
        x = torch.randn(rows, in_features)
        torch.testing.assert_close(cpu.panel_linear(x, panels, out_features, b, isa=isa),
                                   nn.functional.linear(x, weight, b), atol=1e-4, rtol=1e-4)
    rows_of_a_wider_tensor = torch.randn(4, 2 * in_features)[:, :in_features]  # not contiguous
    torch.testing.assert_close(cpu.panel_linear(rows_of_a_wider_tensor, panels, out_features, b, isa=isa),
                               nn.functional.linear(rows_of_a_wider_tensor, weight, b), atol=1e-4, rtol=1e-4)


@pytest.mark.skipif("avx2" not in PANEL_ISAS, reason="this CPU has no AVX2/FMA")
def test_avx2_panels_take_steps_under_their_row_limit_and_plain_f_linear_the_rest(monkeypatch):
    monkeypatch.setenv(cpu_gemm.PANEL_ISA_ENV, "avx2")  # as on a CPU without AVX-512
    torch.manual_seed(1)
    weight, bias = torch.randn(960, 576), torch.randn(960)
    packed = cpu_gemm.pack_weight(weight)
    assert packed.panels and packed.isa == "avx2" and packed.max_rows == cpu_gemm.AVX2_PANEL_ROWS
    assert cpu_gemm.kernel_name(packed).startswith("llmctl's AVX2 float32 GEMM")
    monkeypatch.setattr(cpu_gemm, "_small_batch", 1)
    paths = []
    panel_linear = cpu.panel_linear
    monkeypatch.setattr(cpu, "panel_linear", lambda *args, **kwargs: paths.append(kwargs["isa"]) or
                        panel_linear(*args, **kwargs))
    for rows in (1, cpu_gemm.AVX2_PANEL_ROWS - 1, cpu_gemm.AVX2_PANEL_ROWS, 300):
        x = torch.randn(rows, 576)
        torch.testing.assert_close(cpu_gemm.linear(x, weight, packed, bias), nn.functional.linear(x, weight, bias),
                                   atol=1e-4, rtol=1e-4)
    assert paths == ["avx2", "avx2"]  # the two steps of 24 rows and more ran F.linear


def test_panel_isa_variable_refuses_a_path_this_machine_lacks(monkeypatch):
    monkeypatch.setenv(cpu_gemm.PANEL_ISA_ENV, "avx9")
    with pytest.raises(SettingError, match="LLMCTL_PANEL_ISA=avx9: this machine's float32 panel paths are"):
        cpu_gemm.pack_weight(torch.randn(64, 96))
    monkeypatch.setenv(cpu_gemm.PANEL_ISA_ENV, "off")
    assert not cpu_gemm.pack_weight(torch.randn(64, 96)).panels  # oneDNN's layout instead


@pytest.mark.skipif(not AVX512, reason="the panel GEMM needs AVX-512; oneDNN packs float32 here")
def test_float32_packs_into_panels_and_bfloat16_for_amx_or_onednn():
    weight = torch.randn(64, 96)
    assert cpu_gemm.pack_weight(weight).panels
    assert cpu_gemm.kernel_name(cpu_gemm.pack_weight(weight)) == "llmctl's AVX-512 float32 GEMM"
    bf16 = cpu_gemm.pack_weight(weight.bfloat16())
    assert bf16 is not None and bf16.panels == cpu.bf16_panels_supported()
    assert cpu_gemm.kernel_name(bf16) == ("oneDNN's CPU GEMMs" if not bf16.panels else "llmctl's AMX bfloat16 GEMM"
                                          if cpu.bf16_amx_supported() else "llmctl's AVX512-BF16 bfloat16 GEMM")
    # AMX tiles take K in 32s, vdpbf16ps in pairs: other K go to oneDNN
    assert cpu_gemm.pack_weight(torch.randn(64, 80).bfloat16()).panels == (bf16.panels and not bf16.amx)
    assert not cpu_gemm.pack_weight(torch.randn(64, 81).bfloat16()).panels
    x = torch.randn(8, 96).bfloat16()
    torch.testing.assert_close(bf16.linear(x, None), nn.functional.linear(x, weight.bfloat16()), atol=5e-2, rtol=2e-2)


BF16_PATHS = [pytest.param(True, id="amx", marks=pytest.mark.skipif(
                  not cpu.bf16_amx_supported(), reason="no AMX here (or Linux refused its tile state)")),
              pytest.param(False, id="avx512-bf16", marks=pytest.mark.skipif(
                  not cpu.bf16_panels_supported(), reason="this CPU has no AVX512-BF16"))]


@pytest.mark.parametrize("use_amx", BF16_PATHS)
@pytest.mark.parametrize("out_features,in_features", [(5, 32), (40, 96), (960, 576), (576, 1536), (1000, 64), (48, 34)])
@pytest.mark.parametrize("bias", [False, True])
def test_bfloat16_panel_linear_equals_the_float_product_rounded(use_amx, out_features, in_features, bias):
    # (48, 34): K not a multiple of 32, which AMX leaves to the AVX512-BF16 loop
    torch.manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features).bfloat16()
    b = torch.randn(out_features).bfloat16() if bias else None
    panels = cpu.pack_panels(weight)
    assert panels.shape == (2 * -(-out_features // 32), in_features, 16) and panels.dtype == torch.bfloat16
    # rows: AMX's 16-row tiles and a tail (1, 5, 16, 17, 40, 300), the AVX512-BF16 loop's tiles of up to 8
    for rows in (1, 2, 5, 8, 9, 16, 17, 40, 129, 300):
        x = torch.randn(rows, in_features).bfloat16()
        expected = nn.functional.linear(x.double(), weight.double(), None if b is None else b.double())
        got = cpu.panel_linear(x, panels, out_features, b, use_amx=use_amx)
        assert got.dtype == torch.bfloat16
        # float32 sums rounded once to bfloat16: within half a bfloat16 step (2^-8 relative) plus the sums' error
        torch.testing.assert_close(got.double(), expected, rtol=2 ** -8, atol=1e-3 * in_features ** 0.5)


@pytest.mark.skipif(not AVX512, reason="the panel GEMM needs AVX-512; oneDNN packs float32 here")
def test_panel_linear_refuses_what_it_cannot_take():
    panels = cpu.pack_panels(torch.randn(40, 96))
    with pytest.raises(RuntimeError, match="K = x.size"):
        cpu.panel_linear(torch.randn(2, 95), panels, 40)
    with pytest.raises(RuntimeError, match="bias"):
        cpu.panel_linear(torch.randn(2, 96), panels, 40, torch.randn(39))
    with pytest.raises(RuntimeError, match="out_features"):
        cpu.panel_linear(torch.randn(2, 96), panels, 65)


def test_the_crossover_is_the_first_batch_where_the_packed_weight_wins(monkeypatch):
    """The timer is injected: plain costs grow with the rows, the packed path costs 2.5."""
    weight = torch.randn(64, 32)
    packed = cpu_gemm.pack_weight(weight)
    costs = {"plain": lambda rows: float(rows), "packed": lambda rows: 2.5}
    last: dict = {}
    monkeypatch.setattr(cpu_gemm.F, "linear", lambda x, w, b=None: last.update(path="plain", rows=x.shape[0]))
    monkeypatch.setattr(type(packed), "linear", lambda self, x, b: last.update(path="packed", rows=x.shape[0]))

    def timed(call) -> float:
        call()
        return costs[last["path"]](last["rows"])

    monkeypatch.setattr(cpu_gemm, "_fastest_seconds", timed)
    monkeypatch.setattr(cpu_gemm, "_measured", {})
    assert cpu_gemm.measure_small_batch(weight, packed) == 3
    costs["packed"] = lambda rows: 1e9  # never faster: every small batch stays on the plain path
    assert cpu_gemm.measure_small_batch(weight, packed) == 3  # measured once per process and shape
    cpu_gemm._measured.clear()
    assert cpu_gemm.measure_small_batch(weight, packed) == cpu_gemm.MAX_SMALL_BATCH


def test_the_measured_crossover_decides_the_path(monkeypatch):
    weight = torch.randn(3072, 576)
    packed = cpu_gemm.pack_weight(weight)
    calls = []
    monkeypatch.setattr(cpu_gemm.F, "linear", lambda *args: calls.append("plain") or torch.zeros(1))
    monkeypatch.setattr(cpu_gemm, "_small_batch", 3)
    cpu_gemm.linear(torch.randn(2, 576), weight, packed)
    assert calls == ["plain"]
    assert cpu_gemm.linear(torch.randn(3, 576), weight, packed).shape == (3, 3072) and calls == ["plain"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul_of_the_fused_gate_up_output(dtype):
    from llmctl.engine.layers.activations import silu_and_mul_reference as silu_and_mul

    fused = torch.randn(9, 2 * 1536).to(dtype) * 4
    torch.testing.assert_close(cpu.silu_and_mul(fused), silu_and_mul(fused, 1536), atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gelu_tanh_and_mul_of_the_fused_gate_up_output(dtype):
    # Gemma's GeGLU against torch's own tanh-approximated GELU
    fused = torch.randn(9, 2 * 1536).to(dtype) * 4
    gate, up = fused.split(1536, dim=-1)
    expected = torch.nn.functional.gelu(gate, approximate="tanh") * up
    torch.testing.assert_close(cpu.gelu_tanh_and_mul(fused), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_gemma_norm_through_the_fused_kernel_equals_transformers():
    """(1 + weight) RMSNorm through llmctl's fused kernel, the residual add included, against transformers'."""
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    from llmctl.engine.models.gemma import GemmaRMSNorm

    ours, theirs = GemmaRMSNorm(576, 1e-6), Gemma2RMSNorm(576, 1e-6)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.5)
        ours.weight.copy_(theirs.weight)
    x, residual = torch.randn(7, 576) * 3, torch.randn(7, 576)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-5)
    normed, total = ours.add_and_norm(x.clone(), residual.clone())
    torch.testing.assert_close(total, x + residual)
    torch.testing.assert_close(normed, theirs(x + residual), atol=1e-5, rtol=1e-5)


def _smaps_field(address: int, field: str) -> list[str]:
    """A field ("VmFlags:", "Rss:", …) of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == field:
            return line.split()[1:]
    return []


def _vm_flags(address: int) -> list[str]:
    return _smaps_field(address, "VmFlags:")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_on_huge_pages_are_aligned_zeros_advised_for_huge_pages(dtype):
    from llmctl.kernels.huge_pages import HUGE_PAGE, zeros_on_huge_pages

    tensor = zeros_on_huge_pages((3, 1000, 2, 3, 64), dtype)
    assert tensor.shape == (3, 1000, 2, 3, 64) and tensor.dtype == dtype and tensor.is_contiguous()
    assert tensor.data_ptr() % HUGE_PAGE == 0 and not tensor.any()
    tensor[2, 999] = 1  # the last element is ours to write
    assert int(tensor.sum()) == 2 * 3 * 64
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():  # a Linux with THP: MADV_HUGEPAGE shows as "hg"
        assert "hg" in _vm_flags(tensor.data_ptr())
    small = zeros_on_huge_pages((4, 4), dtype)  # under 2 MiB: a plain allocation
    assert small.shape == (4, 4) and not small.any()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="resident memory is read from Linux's smaps")
def test_a_populated_buffer_is_resident_at_once_and_an_unpopulated_one_is_not():
    from llmctl.kernels.huge_pages import zeros_on_huge_pages

    nbytes = 16 * 1024**2
    populated = zeros_on_huge_pages((nbytes // 4,), torch.float32)
    lazy = zeros_on_huge_pages((nbytes // 4,), torch.float32, populate=False)
    resident_kib = [int(_smaps_field(t.data_ptr(), "Rss:")[0]) for t in (populated, lazy)]
    assert resident_kib[0] >= nbytes // 1024  # faulted in at allocation: serving's memory stays flat
    assert resident_kib[1] < nbytes // 1024 // 2  # left for its first writer (the panel arena's packing)
    assert not populated.any() and not lazy.any()


@pytest.mark.skipif(not AVX512, reason="the panel GEMM needs AVX-512; oneDNN packs float32 here")
def test_a_models_panels_share_one_huge_page_buffer_and_compute_the_same():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(576, 960), nn.Linear(960, 100, bias=False), nn.Linear(100, 1536))
    reference = [(m.weight.detach().clone(), None if m.bias is None else m.bias.detach().clone()) for m in model]
    cpu_gemm.pack_linears(model)
    buffers = {m.packed.data.untyped_storage().data_ptr() for m in model}
    assert len(buffers) == 1  # one arena
    x = torch.randn(9, 576)
    expected = x
    for weight, bias in reference:
        expected = nn.functional.linear(expected, weight, bias)
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)
