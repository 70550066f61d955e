"""Positional encodings: rotary embeddings (with transformers' scaling rules) and ALiBi slopes."""

from __future__ import annotations

import math
from typing import Any

import torch

from llmctl.kernels import cpu as cpu_kernels

TABLE_MIN_POSITIONS = 1024  # the CPU table's first length; it doubles past the largest position seen


class RotaryEmbedding(torch.nn.Module):
    """RoPE in the rotate-half layout transformers uses for Llama-family checkpoints.

    Frequencies come from transformers' own ROPE_INIT_FUNCTIONS (linear, dynamic, llama3,
    yarn, longrope), so scaling matches the reference implementation exactly.
    """

    def __init__(self, hf_config: Any, head_dim: int, layer_type: str | None = None) -> None:
        """`layer_type`: Gemma 3 keeps one set of RoPE parameters per kind of layer ("full_attention",
        "sliding_attention")."""
        super().__init__()
        params = getattr(hf_config, "rope_parameters", None) or {}
        if layer_type is not None:
            params = params[layer_type]
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            theta = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
            rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
            inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
            scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            extra = {} if layer_type is None else {"layer_type": layer_type}
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, **extra)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.attention_scaling = float(scaling)
        # LongRoPE (Phi-3/4): short factors up to the pretraining length, long factors for a sequence past it
        self.original_max: int | None = None
        if rope_type == "longrope":
            self.original_max = int(params.get("original_max_position_embeddings")
                                    or hf_config.original_max_position_embeddings)
            long_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](hf_config, seq_len=self.original_max + 1)
            self.register_buffer("long_inv_freq", long_freq.float(), persistent=False)
        self._cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # positions, cos, sin
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None  # CPU: cos, sin [positions, 1, rotary]

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; query [T, H, D], key [T, KVH, D]; lengths [T]: each token's sequence length after
        this step (LongRoPE's switch; None: position + 1, a decode step's). On CPUs rotated in place by one
        C++ op."""
        cos, sin = self.cos_sin(positions, query.dtype, lengths)
        if cpu_kernels.fused_layers_for(query) and query.stride(-1) == 1 and key.stride(-1) == 1:
            cpu_kernels.rotary(query, key, cos.squeeze(1), sin.squeeze(1))
            return query, key
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, 1, rotary] cos and sin in `dtype` (scaled by the attention scaling; LongRoPE's factors by length).
        Every layer of a step rotates by the same positions: computed once per step."""
        if self._cached is not None and self._cached[0] is positions and self._cached[1].dtype == dtype:
            return self._cached[1], self._cached[2]
        if positions.device.type == "cpu" and self.original_max is None:
            cos, sin = self._looked_up(positions, dtype)
        else:
            cos, sin = self._computed(positions, dtype, lengths)
        self._cached = (positions, cos, sin)
        return cos, sin

    def _looked_up(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """On CPUs from a table of every position so far (vLLM's cos_sin_cache; the same float32 products, so
        the same values): two lookups instead of ten small ops, a host cost each decode step pays."""
        if self._table is not None and self._table[0].dtype == dtype:
            try:
                return self._table[0][positions], self._table[1][positions]
            except IndexError:  # a position past the table: it grows below
                pass
        end = int(positions.max()) + 1 if positions.numel() else 0
        length = max(TABLE_MIN_POSITIONS, 1 << max(end - 1, 0).bit_length())
        self._table = self._computed(torch.arange(length), dtype, None)
        return self._table[0][positions], self._table[1][positions]

    def _computed(self, positions: torch.Tensor, dtype: torch.dtype,
                  lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq.unsqueeze(0)
        if self.original_max is not None:
            # as transformers: long factors for every token of a forward whose sequence passes the length
            # it was pretrained on (per sequence here; transformers runs one sequence per forward)
            ends = lengths if lengths is not None else positions + 1
            long = positions.float().unsqueeze(-1) * self.long_inv_freq.unsqueeze(0)
            freqs = torch.where((ends > self.original_max).unsqueeze(-1), long, freqs)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype).unsqueeze(1)
        sin = (emb.sin() * self.attention_scaling).to(dtype).unsqueeze(1)
        return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    half = rotary // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    out = x_rot * cos + rotated * sin
    return torch.cat((out, x_pass), dim=-1) if x_pass.numel() else out


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes as BLOOM computes them (also for head counts that are not powers of 2)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = torch.pow(torch.tensor(base, dtype=torch.float32), torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        extra = torch.pow(torch.tensor(extra_base, dtype=torch.float32),
                          torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32))
        slopes = torch.cat([slopes, extra])
    return slopes


def mrope_rows(sections: list[int], interleaved: bool) -> torch.Tensor:
    """Which position row (0 t, 1 h, 2 w) turns each rotary frequency of a half: consecutive sections
    (Qwen2-VL), or t, h, w in turn up to 3 × the h and w sections, t beyond (Qwen3-VL's interleaved M-RoPE)."""
    half = sum(sections)
    if not interleaved:
        return torch.tensor([row for row, size in enumerate(sections) for _ in range(size)])
    rows = [0] * half
    for row in (1, 2):
        for index in range(row, min(3 * sections[row], half), 3):
            rows[index] = row
    return torch.tensor(rows)


class MRotaryEmbedding(RotaryEmbedding):
    """M-RoPE: each rotary frequency turns by one row of [3, T] (t, h, w) positions — in sections (Qwen2-VL's
    rope_parameters mrope_section) or interleaved (Qwen3-VL), the same for both halves. Positions [T] (a step of
    text only) are the same position three times: plain RoPE."""

    def __init__(self, hf_config: Any, head_dim: int, interleaved: bool = False) -> None:
        super().__init__(hf_config, head_dim)
        sections = (getattr(hf_config, "rope_parameters", None) or {}).get("mrope_section")
        if not sections or sum(sections) * 2 != head_dim:
            raise ValueError(f"mrope_section {sections} does not split head_dim {head_dim} in halves")
        rows = mrope_rows([int(s) for s in sections], interleaved)
        self.rows = torch.cat([rows, rows])  # [head_dim]

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype,
                lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 1:
            return super().cos_sin(positions, dtype, lengths)
        if self._cached is not None and self._cached[0] is positions and self._cached[1].dtype == dtype:
            return self._cached[1], self._cached[2]
        cos, sin = super().cos_sin(positions.reshape(-1), dtype, lengths)  # [3T, 1, D] by row
        tokens = positions.shape[1]
        cos, sin = cos.view(3, tokens, 1, -1), sin.view(3, tokens, 1, -1)
        index = self.rows.to(cos.device).view(1, 1, 1, -1).expand(1, tokens, 1, -1)
        picked_cos, picked_sin = cos.gather(0, index)[0], sin.gather(0, index)[0]
        self._cached = (positions, picked_cos, picked_sin)
        return picked_cos, picked_sin
