"""The `torch` attention backend: gathers each sequence's pages and calls SDPA.

Decodes (one new token each) run as padded batches of similar context length; prefill
chunks run one sequence at a time with a causal mask offset by the tokens already in the
cache. For decodes the query heads that share a KV head are folded into the query-length
dimension, so SDPA reads each K/V head once instead of repeating it per query head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmctl.engine.layers.attention import AttentionMetadata, KVCache


@dataclass
class _Prefill:
    tokens: slice  # rows of the flat batch
    key_slots: torch.Tensor  # [L] cache slots of the whole context
    mask: torch.Tensor  # [q, L] True where attention is allowed
    key_positions: torch.Tensor  # [L] for ALiBi


@dataclass
class _Decodes:
    rows: torch.Tensor  # [B] rows of the flat batch
    key_slots: torch.Tensor  # [B, Lmax]
    mask: torch.Tensor  # [B, 1, 1, Lmax]
    key_positions: torch.Tensor  # [Lmax]


def _context_slots(block_table: list[int], length: int, block_size: int) -> torch.Tensor:
    blocks = torch.tensor(block_table, dtype=torch.long)
    positions = torch.arange(length)
    return blocks[positions // block_size] * block_size + positions % block_size


class TorchAttention:
    name = "torch"

    def __init__(self) -> None:
        self.meta: AttentionMetadata | None = None
        self.prefills: list[_Prefill] = []
        self.decodes: list[_Decodes] = []

    def prepare(self, meta: AttentionMetadata, device: torch.device) -> None:
        self.meta = meta
        self.prefills, decode_rows, decode_slots, decode_lens = [], [], [], []
        for i in range(meta.num_seqs):
            start, q_len, length = meta.query_start_loc[i], meta.query_len(i), meta.seq_lens[i]
            slots = _context_slots(meta.block_tables[i], length, meta.block_size)
            if q_len == 1:
                decode_rows.append(start)
                decode_slots.append(slots)
                decode_lens.append(length)
                continue
            query_pos = torch.arange(length - q_len, length).unsqueeze(1)
            mask = torch.arange(length).unsqueeze(0) <= query_pos
            self.prefills.append(_Prefill(slice(start, start + q_len), slots.to(device), mask.to(device),
                                          torch.arange(length, device=device)))
        self.decodes = [_decode_batch([decode_rows[i] for i in group], [decode_slots[i] for i in group],
                                      [decode_lens[i] for i in group], device)
                        for group in _length_groups(decode_lens)]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
        assert self.meta is not None, "prepare() runs before forward()"
        kv = cache.flat_slots()  # [2, slots, KVH, D]
        kv[0].index_copy_(0, self.meta.slot_mapping, key.to(kv.dtype))
        kv[1].index_copy_(0, self.meta.slot_mapping, value.to(kv.dtype))
        output = torch.empty_like(query)
        gqa = query.shape[1] != key.shape[1]
        for p in self.prefills:
            q = query[p.tokens].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            k, v = _gather(kv, p.key_slots, q.dtype)  # [1, KVH, L, D] each
            mask = _bias(p.mask, p.key_positions, alibi_slopes, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            output[p.tokens] = out.squeeze(0).transpose(0, 1)
        for d in self.decodes:
            output.index_copy_(0, d.rows, _decode(query.index_select(0, d.rows), kv, d, scale, alibi_slopes))
        return output


def _decode(query: torch.Tensor, kv: torch.Tensor, d: _Decodes, scale: float,
            slopes: torch.Tensor | None) -> torch.Tensor:
    """query [B, H, D] -> [B, H, D] for one new token per sequence."""
    batch, heads, dim = query.shape
    k, v = _gather(kv, d.key_slots, query.dtype)  # [B, KVH, Lmax, D] each
    if slopes is None:  # fold the query heads of a KV head into the query-length dimension
        q = query.view(batch, k.shape[1], heads // k.shape[1], dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=d.mask, scale=scale)
        return out.reshape(batch, heads, dim)
    mask = _bias(d.mask, d.key_positions, slopes, query.dtype)
    out = F.scaled_dot_product_attention(query.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=heads != k.shape[1])
    return out.squeeze(2)


def _length_groups(lengths: list[int], ratio: float = 0.6) -> list[list[int]]:
    """Indices grouped so that no group pads a context to more than 1/ratio of its length."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] >= ratio * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _decode_batch(rows: list[int], slots: list[torch.Tensor], lengths: list[int], device: torch.device) -> _Decodes:
    longest = max(lengths)
    padded = torch.zeros(len(rows), longest, dtype=torch.long)
    for row, row_slots in enumerate(slots):
        padded[row, : len(row_slots)] = row_slots
    valid = torch.arange(longest).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return _Decodes(torch.tensor(rows, device=device), padded.to(device), valid[:, None, None, :].to(device),
                    torch.arange(longest, device=device))


def _gather(kv: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the given cache slots ([L] or [B, L]) with one index_select: [..., KVH, L, D] each."""
    both = kv.index_select(1, slots.reshape(-1)).view(2, *slots.shape, *kv.shape[2:]).to(dtype)
    if slots.dim() == 1:
        both = both.unsqueeze(1)  # a batch of one
    return both[0].transpose(1, 2), both[1].transpose(1, 2)


def _bias(mask: torch.Tensor, key_positions: torch.Tensor, slopes: torch.Tensor | None,
          dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask, or for ALiBi a float bias slope·key_position (BLOOM's form) with -inf masked."""
    if slopes is None:
        return mask
    bias = slopes.to(dtype).view(-1, 1, 1) * key_positions.to(dtype).view(1, 1, -1)  # [H, 1, L]
    bias = bias.masked_fill(~mask, float("-inf")) if mask.dim() == 2 else \
        bias.unsqueeze(0).masked_fill(~mask, float("-inf"))
    return bias
