"""The `mla` attention backend: multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache.

The cache holds, per token and layer, one entry of kv_lora_rank + qk_rope_head_dim values: the
normalised KV latent c and the rotated, head-shared RoPE key (KVCache with one "head", see
llmctl.engine.worker.kv_cache). The model absorbs kv_b_proj's key rows into the query
(q_nope · W_UK, as vLLM's MLA backends do), so every head scores [q_latent | q_rope] against the
entry as one shared key — multi-query attention whose values are the latent part of the same entry —
and the model maps the attended latent to each head's value with W_UV afterwards. Nothing but the
latent is read: no per-head K or V exists. Prompts use the same absorbed form (vLLM expands the
latent for prefill on GPUs, where prefill is compute-bound; one path here keeps the two exact alike).

Sequences are planned as the `torch` backend plans them (llmctl.engine.layers.torch_attention): one
prompt chunk at a time with its causal mask, decodes in padded batches of similar length. The query
heads are folded into the query rows, so one SDPA call reads each latent row once for all heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.engine.layers.attention import KVCache
from llmctl.engine.layers.torch_attention import TorchAttention


class LatentAttention(TorchAttention):
    name = "mla"

    def attend_latent(self, query: torch.Tensor, entries: torch.Tensor, cache: KVCache, *, scale: float,
                      latent_dim: int) -> torch.Tensor:
        """query [T, H, E] (absorbed latent part, then rope part), entries [T, E] (this step's new tokens)
        -> attended latents [T, H, latent_dim]; the entries are stored in their slots first."""
        assert self.meta is not None, "prepare() runs before attend_latent()"
        flat = cache.kv.view(-1, cache.kv.shape[-1])
        flat.index_copy_(0, self.meta.slot_mapping, entries.to(flat.dtype))
        prefills, decodes = self._plan(self.meta.sliding_window)
        latent = cache.kv[:, :, 0, 0]  # [num_blocks, block_size, E]
        heads, width = query.shape[1], query.shape[2]
        output = query.new_empty(query.shape[0], heads, latent_dim)
        for p in prefills:
            keys = latent.index_select(0, p.blocks).reshape(1, 1, -1, width).to(query.dtype)
            rows = query[p.tokens].reshape(1, 1, -1, width)  # row t·H + h: token t, head h
            mask = p.mask.repeat_interleave(heads, dim=0)
            out = F.scaled_dot_product_attention(rows, keys, keys[..., :latent_dim], attn_mask=mask, scale=scale)
            output[p.tokens] = out.view(-1, heads, latent_dim)
        for d in decodes:
            keys = latent.index_select(0, d.blocks.reshape(-1)).view(len(d.blocks), 1, -1, width).to(query.dtype)
            rows = query.index_select(0, d.rows).unsqueeze(1)  # [B, 1, H, E]: heads as query rows
            out = F.scaled_dot_product_attention(rows, keys, keys[..., :latent_dim], attn_mask=d.mask, scale=scale)
            output.index_copy_(0, d.rows, out.squeeze(1))
        return output
