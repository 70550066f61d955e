"""The gated DeltaNet (linear attention) of Qwen3-Next and Qwen3.5 on the engine's flat batch: Qwen3-Next's
in_proj_qkvz gives q, k, v and the output gate z grouped per key head (transformers' fix_query_key_value_ordering),
its in_proj_ba β's input b and the decay's input a per value head; Qwen3.5 projects q·k·v, z, b and a apart. Then a
causal depthwise convolution over q·k·v with SiLU; the gated delta rule with β = σ(b) and
g = −exp(A_log)·softplus(a + dt_bias); an RMSNorm per value head, times SiLU(z); out_proj. Each sequence's convolution
window and delta-rule state live in the state cache (llmctl.engine.layers.recurrent_state)."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.delta_net import GatedDeltaNetSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import causal_conv, delta_rule
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear
from llmctl.engine.layers.recurrent_state import MambaState, StateStep, decode_kernel, run_by_sequence
from llmctl.engine.layers.stacked_rows import HeadVectors, ShardedRows, StackedColumnLinear


class NormThenGate(ShardedRows):
    """RMSNorm(x) · weight, then × SiLU(gate), in float32 (Qwen3NextRMSNormGated: norm before gate); the weight is
    per value-head dimension, whole on every rank."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__([Part(size, 0, size)], {"weight": ()}, fill=1.0)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return ((self.weight * normed.to(dtype)) * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(HeadVectors, nn.Module):
    """TP splits the key heads, each with its value heads: in_proj_qkvz and in_proj_ba hold their rows grouped per
    key head, so a rank's rows are whole groups; the convolution's q, k and v rows and the value heads' vectors
    are split likewise, out_proj by its input columns."""

    def __init__(self, mixer: GatedDeltaNetSpec, eps: float, group: TPGroup, quant: QuantizationSpec | None = None
                 ) -> None:
        super().__init__()
        self.spec = mixer
        self.head_vectors = ("dt_bias", "A_log")  # loaded as this rank's heads (HeadVectors)
        tp = group.size
        self.k_heads, self.v_heads = mixer.num_k_heads // tp, mixer.num_v_heads // tp
        self.key_dim, self.value_dim = mixer.key_dim // tp, mixer.value_dim // tp
        keys, values = Part.split(mixer.key_dim, group), Part.split(mixer.value_dim, group)
        h, heads = mixer.hidden_size, Part.split(mixer.num_v_heads, group)
        if mixer.grouped:  # Qwen3-Next: one projection, its rows grouped per key head
            qkvz = 2 * mixer.key_dim + 2 * mixer.value_dim
            self.in_proj_qkvz = ColumnParallelLinear(h, [Part.split(qkvz, group)], False, quant)
            self.in_proj_ba = ColumnParallelLinear(h, [Part.split(2 * mixer.num_v_heads, group)], False)
        else:  # Qwen3.5: q, k, v of every head in one projection, z, b and a in their own
            self.in_proj_qkv = StackedColumnLinear(h, [keys, keys, values], False, quant)
            self.in_proj_z = ColumnParallelLinear(h, [values], False, quant)
            self.in_proj_b = ColumnParallelLinear(h, [heads], False)
            self.in_proj_a = ColumnParallelLinear(h, [heads], False)
        self.conv1d = ShardedRows([keys, keys, values], {"weight": (1, mixer.conv_kernel)})  # causal_conv runs it
        self.head_part = Part.split(mixer.num_v_heads, group)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = NormThenGate(mixer.head_v_dim, eps)
        self.out_proj = RowParallelLinear(values, mixer.hidden_size, False, group, quant)

    def forward(self, x: torch.Tensor, states: StateStep, layer: int) -> torch.Tensor:
        qkv, z, b, a = self._split(self.in_proj_qkvz(x), self.in_proj_ba(x)) if self.spec.grouped else \
            (self.in_proj_qkv(x), self.in_proj_z(x).view(x.shape[0], self.v_heads, -1), self.in_proj_b(x),
             self.in_proj_a(x))
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        y = torch.empty(x.shape[0], self.v_heads, self.spec.head_v_dim, dtype=torch.float32, device=x.device)
        kernels = decode_kernel(x, states.layer(layer).ssm)
        run_by_sequence(states, layer, y,
                        lambda rows, state, slots: self._decode(qkv[rows], g[rows], beta[rows], state.conv,
                                                                state.ssm, slots, kernels),
                        lambda span, state, slot: self._prefill(qkv[span], g[span], beta[span], state.conv,
                                                                state.ssm, slot),
                        indexed=kernels is not None,
                        prefill_batch=lambda spans, state, slots: self._prefill_batch(qkv, g, beta, spans, state,
                                                                                      slots))
        out = self.norm(y.to(x.dtype), z)
        return self.out_proj(out.reshape(x.shape[0], self.value_dim))

    def _split(self, qkvz: torch.Tensor, ba: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, ·] grouped per key head (q, k, v…, z… of its value heads; b…, a…) -> q·k·v [T, conv_dim] as the
        convolution takes it, z [T, Hv, dv], b and a [T, Hv]."""
        spec = self.spec
        tokens, per_key = qkvz.shape[0], spec.num_v_heads // spec.num_k_heads
        grouped = qkvz.view(tokens, self.k_heads, -1)
        q, k, v, z = grouped.split([spec.head_k_dim, spec.head_k_dim, per_key * spec.head_v_dim,
                                    per_key * spec.head_v_dim], dim=-1)
        b, a = ba.view(tokens, self.k_heads, -1).split([per_key, per_key], dim=-1)
        qkv = torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1), v.reshape(tokens, -1)], dim=-1)
        return (qkv, z.reshape(tokens, self.v_heads, spec.head_v_dim), b.reshape(tokens, -1),
                a.reshape(tokens, -1))

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = self.spec
        q, k, v = F.silu(qkv).split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (q.reshape(-1, self.k_heads, spec.head_k_dim), k.reshape(-1, self.k_heads, spec.head_k_dim),
                v.reshape(-1, self.v_heads, spec.head_v_dim))

    def _decode(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                slots: torch.Tensor | slice, kernels: ModuleType | None) -> torch.Tensor:
        out = causal_conv.conv_step_in_slots(qkv, conv, slots, self.conv1d.weight[:, 0], None, kernels)
        if kernels is not None:  # one pass over each state, in place in its slot
            q, k, v = self._heads(out)
            q, k = delta_rule.prepare_heads(q, k, v.shape[1])
            return kernels.delta_rule_decode(ssm, slots, q, k, v, g, beta)
        y, new = delta_rule.step_delta_rule(ssm[slots], *self._heads(out), g, beta)
        if isinstance(slots, torch.Tensor) or new.dtype != ssm.dtype:  # a gathered copy, or another dtype
            ssm[slots] = new.to(ssm.dtype)
        return y

    def _prefill_batch(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, spans: list[slice],
                       state: MambaState, slots: list[int]) -> list[torch.Tensor]:
        """Several sequences' prompt chunks: each one's convolution from its window, then one delta rule for all."""
        heads = []
        for span, slot in zip(spans, slots):
            out, state.conv[slot] = causal_conv.conv_chunk(qkv[span], state.conv[slot], self.conv1d.weight[:, 0], None)
            heads.append(self._heads(out))
        index = torch.tensor(slots, device=qkv.device)
        ys, finals = delta_rule.chunk_delta_rule_batch([h[0] for h in heads], [h[1] for h in heads],
                                                       [h[2] for h in heads], [g[span] for span in spans],
                                                       [beta[span] for span in spans], state.ssm[index])
        state.ssm[index] = finals.to(state.ssm.dtype)
        return ys

    def _prefill(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                 slot: int) -> torch.Tensor:
        out, conv[slot] = causal_conv.conv_chunk(qkv, conv[slot], self.conv1d.weight[:, 0], None)
        y, final = delta_rule.chunk_delta_rule(*self._heads(out), g, beta, ssm[slot])
        ssm[slot] = final.to(ssm.dtype)
        return y
