"""RoPE + KV store in one launch (kernels/rotary_store.py) against transformers' rotate-half RoPE and the KV
store's reference: under Triton's interpreter on CPU tensors in float32, compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from llmctl.kernels.kv_store import store_kv_reference
from llmctl.kernels.rotary_store import rotary_store

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float32 if DEVICE == "cpu" else torch.bfloat16


def rotate_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb over the first cos.shape[-1] dimensions (partial rotary: the rest pass)."""
    rotary = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    x1, x2 = x_rot[..., : rotary // 2], x_rot[..., rotary // 2:]
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass), dim=-1)


def cos_sin(positions: torch.Tensor, rotary: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(DTYPE).unsqueeze(1).to(DEVICE), emb.sin().to(DTYPE).unsqueeze(1).to(DEVICE)


@pytest.mark.parametrize("heads,kv_heads,head_dim,rotary", [(4, 2, 64, 64), (6, 3, 80, 40), (2, 1, 16, 16)])
@pytest.mark.parametrize("fp8", [None, torch.float8_e4m3fn, torch.float8_e5m2])  # the manual rounding against torch's
def test_rotates_q_and_k_from_the_projection_and_stores_k_and_v(heads, kv_heads, head_dim, rotary, fp8):
    tokens, block_size = 5, 8
    gen = torch.Generator().manual_seed(heads + head_dim)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(DTYPE).to(DEVICE)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))  # views of the projection, as the layer has them
    assert not q.is_contiguous()
    cos, sin = cos_sin(torch.tensor([0, 3, 7, 8, 30]), rotary)
    slots = torch.tensor([3, 9, -1, 0, 17], dtype=torch.int64, device=DEVICE)  # -1: a padding row
    dtype = fp8 or DTYPE
    cache = torch.zeros(4, block_size, 2, kv_heads, head_dim, device=DEVICE).to(dtype)
    expected = torch.zeros_like(cache)
    scales = dict(k_scale=0.5, v_scale=2.0) if fp8 else {}

    query = rotary_store(q, k, v, cos, sin, cache, slots, **scales)
    store_kv_reference(rotate_half_reference(k, cos, sin), v, expected, slots, **scales)
    assert query.is_contiguous()
    torch.testing.assert_close(query, rotate_half_reference(q, cos, sin), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache.float(), expected.float(), atol=1e-6, rtol=1e-6)
    assert cache.float().view(-1, 2, kv_heads, head_dim)[[3, 9, 0, 17]].abs().sum(dim=(1, 2, 3)).gt(0).all()
