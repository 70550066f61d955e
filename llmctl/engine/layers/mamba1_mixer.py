"""Mamba (1)'s mixer (Mamba, Falcon-Mamba) on the engine's flat batch: in_proj to x and the gate z; a causal
depthwise convolution over x and SiLU; x_proj to dt's low rank, B and C (normed first in Falcon-Mamba, without
weights); dt_proj and softplus to each channel's dt; the selective scan (llmctl.engine.layers.selective_scan); y ·
silu(z); out_proj. Each sequence's convolution window and scan state live in the state cache
(llmctl.engine.layers.recurrent_state). TP splits the inner channels as vLLM: x_proj is row-parallel, so dt, B and
C are whole on every rank."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.mamba1 import Mamba1MixerSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import causal_conv, selective_scan
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.layers.recurrent_state import MambaState, StateStep, decode_kernel, run_by_sequence
from llmctl.engine.layers.stacked_rows import HeadVectors, ShardedRows, StackedColumnLinear


def weightless_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class Mamba1Mixer(HeadVectors, nn.Module):
    def __init__(self, mixer: Mamba1MixerSpec, group: TPGroup, quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        self.spec = mixer
        inner = Part.split(mixer.intermediate_size, group)
        self.inner, self.head_part = inner.size, inner
        self.head_vectors = ("A_log", "D")  # this rank's channels (HeadVectors)
        self.in_proj = StackedColumnLinear(mixer.hidden_size, [inner, inner], mixer.proj_bias, quant)
        conv_kinds = {"weight": (1, mixer.conv_kernel), **({"bias": ()} if mixer.conv_bias else {})}
        self.conv1d = ShardedRows([inner], conv_kinds)
        self.x_proj = RowParallelLinear(inner, mixer.x_proj_size, False, group, quant)
        self.dt_proj = ColumnParallelLinear(mixer.dt_rank, [inner], True)
        self.A_log = nn.Parameter(torch.zeros(inner.size, mixer.state_size))
        self.D = nn.Parameter(torch.ones(inner.size))
        self.out_proj = RowParallelLinear(inner, mixer.hidden_size, mixer.proj_bias, group, quant)
        if mixer.bc_dt_norm == "weighted":  # Jamba's norms on dt, B and C
            self.dt_layernorm = RMSNorm(mixer.dt_rank, mixer.norm_eps)
            self.b_layernorm = RMSNorm(mixer.state_size, mixer.norm_eps)
            self.c_layernorm = RMSNorm(mixer.state_size, mixer.norm_eps)

    def forward(self, x: torch.Tensor, states: StateStep, layer: int) -> torch.Tensor:
        xs, gate = self.in_proj(x).split([self.inner, self.inner], dim=-1)
        y = torch.empty(x.shape[0], self.inner, dtype=torch.float32, device=x.device)
        kernels = decode_kernel(x, states.layer(layer).ssm)
        run_by_sequence(states, layer, y,
                        lambda rows, state, slots: self._decode(xs[rows], state.conv, state.ssm, slots, kernels),
                        lambda span, state, slot: self._prefill(xs[span], state.conv, state.ssm, slot),
                        indexed=kernels is not None,
                        prefill_batch=lambda spans, state, slots: self._prefill_batch(xs, spans, state, slots))
        return self.out_proj((y * F.silu(gate.float())).to(x.dtype))

    def _scan_inputs(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The convolution's output after SiLU -> u, dt, B, C in float32."""
        spec = self.spec
        low, B, C = self.x_proj(u).split([spec.dt_rank, spec.state_size, spec.state_size], dim=-1)
        if spec.bc_dt_norm == "weightless":
            low, B, C = (weightless_rms(t, spec.norm_eps) for t in (low, B, C))
        elif spec.bc_dt_norm == "weighted":
            low, B, C = self.dt_layernorm(low), self.b_layernorm(B), self.c_layernorm(C)
        return u.float(), F.softplus(self.dt_proj(low).float()), B.float(), C.float()

    def _decode(self, xs: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, slots: torch.Tensor | slice,
                kernels: ModuleType | None) -> torch.Tensor:
        bias = getattr(self.conv1d, "bias", None)
        out = causal_conv.conv_step_in_slots(xs, conv, slots, self.conv1d.weight[:, 0], bias, kernels)
        u, dt, B, C = self._scan_inputs(F.silu(out))
        if kernels is not None:  # one pass over each state, in place in its slot
            return kernels.selective_scan_decode(ssm, slots, u, dt, -torch.exp(self.A_log.float()), B, C, self.D)
        current = ssm[slots] if ssm.dtype == torch.float32 else ssm[slots].float()
        y, new = selective_scan.step(u, dt, -torch.exp(self.A_log.float()), B, C, self.D.float(), current)
        if isinstance(slots, torch.Tensor) or new.dtype != ssm.dtype:  # a gathered copy, or another dtype
            ssm[slots] = new.to(ssm.dtype)
        return y

    def _prefill_batch(self, xs: torch.Tensor, spans: list[slice], state: MambaState,
                       slots: list[int]) -> list[torch.Tensor]:
        """Several sequences' prompt chunks: each one's convolution from its window, then one scan for them all."""
        bias = getattr(self.conv1d, "bias", None)
        inputs = []
        for span, slot in zip(spans, slots):
            out, state.conv[slot] = causal_conv.conv_chunk(xs[span], state.conv[slot], self.conv1d.weight[:, 0], bias)
            inputs.append(self._scan_inputs(F.silu(out)))
        index = torch.tensor(slots, device=xs.device)
        states = state.ssm[index].float()
        ys = selective_scan.scan_batch([i[0] for i in inputs], [i[1] for i in inputs], -torch.exp(self.A_log.float()),
                                       [i[2] for i in inputs], [i[3] for i in inputs], self.D.float(), states)
        state.ssm[index] = states.to(state.ssm.dtype)
        return ys

    def _prefill(self, xs: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor, slot: int) -> torch.Tensor:
        bias = getattr(self.conv1d, "bias", None)
        out, conv[slot] = causal_conv.conv_chunk(xs, conv[slot], self.conv1d.weight[:, 0], bias)
        u, dt, B, C = self._scan_inputs(F.silu(out))
        state = ssm[slot].float()
        y = selective_scan.scan(u, dt, -torch.exp(self.A_log.float()), B, C, self.D.float(), state)
        ssm[slot] = state.to(ssm.dtype)
        return y
