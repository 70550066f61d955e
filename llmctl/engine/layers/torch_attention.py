"""The `torch` attention backend: gathers each sequence's KV blocks and calls SDPA.

Blocks are gathered whole (one index per 16 tokens, so the copies are long contiguous
runs), then positions past the sequence are masked. Decodes (one new token each) run as
padded batches of similar context length, with the query heads that share a KV head
folded into the query-length dimension so SDPA reads each K/V head once. Prefill chunks
run one sequence at a time with a causal mask offset by the tokens already cached (an image
of Gemma 3's also sees its own later tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from llmctl.engine.layers.attention import AttentionMetadata, KVCache, soft_cap
from llmctl.kernels.fp8 import fp8_format


@dataclass
class _Prefill:
    tokens: slice  # rows of the flat batch
    fresh: bool  # no earlier tokens in the cache: attend over the new K/V directly
    blocks: torch.Tensor  # [n] the sequence's blocks
    mask: torch.Tensor  # [q, n * block_size] True where attention is allowed
    key_positions: torch.Tensor  # [n * block_size] for ALiBi


@dataclass
class _Decodes:
    rows: torch.Tensor  # [B] rows of the flat batch
    blocks: torch.Tensor  # [B, n] padded block tables
    mask: torch.Tensor  # [B, 1, 1, n * block_size]
    key_positions: torch.Tensor  # [n * block_size]


class TorchAttention:
    name = "torch"

    def __init__(self) -> None:
        self.meta: AttentionMetadata | None = None
        self._plans: dict[tuple[int | None, int | None], tuple[list[_Prefill], list[_Decodes]]] = {}  # by window, chunk
        self._device: torch.device | None = None
        self._only: list[int] | None = None
        self._workspace: torch.Tensor | None = None  # reused gather buffer: fresh large buffers cost page faults

    def prepare(self, meta: AttentionMetadata, device: torch.device, only: list[int] | None = None) -> None:
        """`only`: the sequences this backend answers (default all; the `cpu` backend hands it some)."""
        self.meta, self._device, self._only, self._plans = meta, device, only, {}
        self._plan(meta.sliding_window)

    def _plan(self, window: int | None, chunk: int | None = None) -> tuple[list[_Prefill], list[_Decodes]]:
        """Masks for one sliding window (None: full attention) or chunk size, made once per step: models that mix
        sliding and full layers (Gemma) use two, Llama 4 a chunked and a full one."""
        if (window, chunk) in self._plans:
            return self._plans[window, chunk]
        meta, device = self.meta, self._device
        size = meta.block_size
        prefills, decodes = [], []
        for i in range(meta.num_seqs) if self._only is None else self._only:
            start, q_len, length = meta.query_start_loc[i], meta.query_len(i), meta.seq_lens[i]
            blocks = meta.block_tables[i][: -(-length // size)]
            if q_len == 1:
                decodes.append((start, blocks, length))
                continue
            query_pos = torch.arange(length - q_len, length).unsqueeze(1)
            key_pos = torch.arange(len(blocks) * size).unsqueeze(0)
            mask = key_pos <= query_pos
            if window:
                mask &= key_pos > query_pos - window
            if chunk:
                mask &= key_pos >= query_pos // chunk * chunk
            spans = [(first, last) for seq, first, last in meta.both_ways_spans if seq == i]
            for first, last in spans:  # an image's tokens also see its later tokens
                mask |= (key_pos > query_pos) & (query_pos >= first) & (key_pos <= last)
            fresh = q_len == length and not window and not chunk and not spans
            prefills.append(_Prefill(slice(start, start + q_len), fresh, torch.tensor(blocks, device=device),
                                     mask.to(device), torch.arange(len(blocks) * size, device=device)))
        batches = [_decode_batch([decodes[i] for i in group], size, device, window, chunk)
                   for group in _length_groups([length for _, _, length in decodes])]
        self._plans[window, chunk] = prefills, batches
        return self._plans[window, chunk]

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
                scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None,
                chunk: int | None = None) -> torch.Tensor:
        assert self.meta is not None, "prepare() runs before forward()"
        _store(cache.flat_slots(), self.meta.slot_mapping, key, value)
        return self.attend(query, key, value, cache, scale=scale, alibi_slopes=alibi_slopes, window=window,
                           softcap=softcap, sinks=sinks, chunk=chunk)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cache: KVCache, *,
               scale: float, alibi_slopes: torch.Tensor | None = None, window: int | None = None,
               softcap: float | None = None, sinks: torch.Tensor | None = None,
               chunk: int | None = None) -> torch.Tensor:
        """Attention for the prepared sequences, their new K/V already stored; other rows are left unset."""
        prefills, decodes = self._plan(window or self.meta.sliding_window, chunk)
        output = torch.empty_like(query)
        gqa = query.shape[1] != key.shape[1]
        scored = bool(softcap) or sinks is not None  # what SDPA does not compute: the scores made explicitly
        for p in prefills:
            q = query[p.tokens].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            if p.fresh and alibi_slopes is None and not scored and fp8_format(cache.kv.dtype) is None:  # fp8: read what is stored
                k, v = key[p.tokens].transpose(0, 1).unsqueeze(0), value[p.tokens].transpose(0, 1).unsqueeze(0)
                out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), is_causal=True, scale=scale,
                                                     enable_gqa=gqa)
                output[p.tokens] = out.squeeze(0).transpose(0, 1)
                continue
            k, v = self._gather(cache.kv, p.blocks.unsqueeze(0), q.dtype)  # [1, KVH, L, D] each
            mask = _bias(p.mask, p.key_positions, alibi_slopes, q.dtype)
            out = scored_attention(q, k, v, mask, scale, softcap, sinks) if scored else \
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            output[p.tokens] = out.squeeze(0).transpose(0, 1)
        for d in decodes:
            k, v = self._gather(cache.kv, d.blocks, query.dtype)  # [B, KVH, L, D] each
            rows = query.index_select(0, d.rows)
            out = scored_attention(rows.unsqueeze(2), k, v, d.mask, scale, softcap, sinks).squeeze(2) if scored \
                else _decode(rows, k, v, d, scale, alibi_slopes)
            output.index_copy_(0, d.rows, out)
        return output

    def _gather(self, kv: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """kv [num_blocks, block_size, 2, KVH, D], blocks [B, n] -> K and V as [B, KVH, n * block_size, D]."""
        batch, count = blocks.shape
        needed = batch * count
        if self._workspace is None or self._workspace.shape[0] < needed or self._workspace.dtype != kv.dtype:
            self._workspace = torch.empty((max(needed, 256), *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
        both = torch.index_select(kv, 0, blocks.reshape(-1), out=self._workspace[:needed]).to(dtype)
        both = both.view(batch, count * kv.shape[1], 2, kv.shape[3], kv.shape[4])
        return both[:, :, 0].transpose(1, 2), both[:, :, 1].transpose(1, 2)


def _store(flat: torch.Tensor, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    """New K/V into their slots of flat [slots, 2, KVH, D]; fp8 caches are written as bytes
    (torch has no fp8 index_copy on CPUs), clamped to their format's range."""
    fp8 = fp8_format(flat.dtype)
    for index, new in enumerate((key, value)):
        if fp8 is not None:
            new = new.float().clamp(-fp8.limit, fp8.limit).to(fp8.dtype).view(torch.uint8)
            flat.view(torch.uint8)[:, index].index_copy_(0, slots, new)
        else:
            flat[:, index].index_copy_(0, slots, new.to(flat.dtype))


def _decode(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d: _Decodes, scale: float,
            slopes: torch.Tensor | None) -> torch.Tensor:
    """query [B, H, D], K/V [B, KVH, L, D] -> [B, H, D] for one new token per sequence."""
    batch, heads, dim = query.shape
    if slopes is None:  # fold the query heads of a KV head into the query-length dimension
        q = query.view(batch, k.shape[1], heads // k.shape[1], dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=d.mask, scale=scale)
        return out.reshape(batch, heads, dim)
    mask = _bias(d.mask, d.key_positions, slopes, query.dtype)
    out = F.scaled_dot_product_attention(query.unsqueeze(2), k, v, attn_mask=mask, scale=scale,
                                         enable_gqa=heads != k.shape[1])
    return out.squeeze(2)


def scored_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                     softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, q, D], K/V [B, KVH, L, D], mask boolean [.., q, L]: softmax(cap · tanh(q·kᵀ·scale / cap)) · v
    as transformers' eager Gemma 2 attention computes it, and with `sinks` [H] one more logit per head in
    each softmax that weighs no value, as its eager gpt-oss attention does (SDPA has neither)."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = soft_cap(scores, softcap)
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores.float(), sink], dim=-1), dim=-1)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)


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


def _decode_batch(items: list[tuple[int, list[int], int]], size: int, device: torch.device,
                  window: int | None, chunk: int | None = None) -> _Decodes:
    count = max(len(blocks) for _, blocks, _ in items)
    padded = torch.zeros(len(items), count, dtype=torch.long)
    for row, (_, blocks, _) in enumerate(items):
        padded[row, : len(blocks)] = torch.tensor(blocks)
    lengths = torch.tensor([length for _, _, length in items])
    key_pos = torch.arange(count * size).unsqueeze(0)
    valid = key_pos < lengths.unsqueeze(1)
    if window:
        valid &= key_pos > lengths.unsqueeze(1) - 1 - window
    if chunk:
        valid &= key_pos >= (lengths.unsqueeze(1) - 1) // chunk * chunk
    return _Decodes(torch.tensor([row for row, _, _ in items], device=device), padded.to(device),
                    valid[:, None, None, :].to(device), torch.arange(count * size, device=device))


def _bias(mask: torch.Tensor, key_positions: torch.Tensor, slopes: torch.Tensor | None,
          dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask, or for ALiBi a float bias slope·key_position (BLOOM's form) with -inf masked."""
    if slopes is None:
        return mask
    bias = slopes.to(dtype).view(-1, 1, 1) * key_positions.to(dtype).view(1, 1, -1)  # [H, 1, L]
    if mask.dim() == 2:
        return bias.masked_fill(~mask, float("-inf"))
    return bias.unsqueeze(0).masked_fill(~mask, float("-inf"))
