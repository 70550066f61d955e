"""The `torch` attention backend: gathers each sequence's pages and calls SDPA.

Decodes (one new token each) run as one padded batch; prefill chunks run one sequence
at a time with a causal mask offset by the tokens already in the cache.
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
        self.decodes: _Decodes | None = None

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
        self.decodes = None
        if decode_rows:
            longest = max(decode_lens)
            padded = torch.zeros(len(decode_rows), longest, dtype=torch.long)
            for row, slots in enumerate(decode_slots):
                padded[row, : len(slots)] = slots
            valid = torch.arange(longest).unsqueeze(0) < torch.tensor(decode_lens).unsqueeze(1)
            self.decodes = _Decodes(torch.tensor(decode_rows, device=device), padded.to(device),
                                    valid[:, None, None, :].to(device), torch.arange(longest, device=device))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
        assert self.meta is not None, "prepare() runs before forward()"
        flat_k = cache.key.view(-1, *cache.key.shape[2:])
        flat_v = cache.value.view(-1, *cache.value.shape[2:])
        flat_k.index_copy_(0, self.meta.slot_mapping, key.to(flat_k.dtype))
        flat_v.index_copy_(0, self.meta.slot_mapping, value.to(flat_v.dtype))
        output = torch.empty_like(query)
        gqa = query.shape[1] != key.shape[1]
        for p in self.prefills:
            q = query[p.tokens].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            k = flat_k[p.key_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, KVH, L, D]
            v = flat_v[p.key_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
            mask = _bias(p.mask, p.key_positions, alibi_slopes, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            output[p.tokens] = out.squeeze(0).transpose(0, 1)
        if self.decodes is not None:
            d = self.decodes
            q = query[d.rows].unsqueeze(2)  # [B, H, 1, D]
            k = flat_k[d.key_slots].transpose(1, 2).to(q.dtype)  # [B, KVH, Lmax, D]
            v = flat_v[d.key_slots].transpose(1, 2).to(q.dtype)
            mask = _bias(d.mask, d.key_positions, alibi_slopes, q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            output[d.rows] = out.squeeze(2)
        return output


def _bias(mask: torch.Tensor, key_positions: torch.Tensor, slopes: torch.Tensor | None,
          dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask, or for ALiBi a float bias slope·key_position (BLOOM's form) with -inf masked."""
    if slopes is None:
        return mask
    bias = slopes.to(dtype).view(-1, 1, 1) * key_positions.to(dtype).view(1, 1, -1)  # [H, 1, L]
    bias = bias.masked_fill(~mask, float("-inf")) if mask.dim() == 2 else \
        bias.unsqueeze(0).masked_fill(~mask, float("-inf"))
    return bias
