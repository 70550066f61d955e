"""Mamba2's mixer (the SSD layer of Mamba2, Granite 4.0-H, Nemotron-H, Falcon-H1) on the engine's flat batch:
in_proj to the gate z, x·B·C and dt; a causal depthwise convolution over x·B·C; the selective scan; a gated,
grouped RMSNorm; out_proj. Each sequence's convolution window and SSM state live in the state cache
(llmctl.engine.layers.recurrent_state): decodes update theirs together, prompt chunks scan one sequence at a time
from the state their previous chunk left (zeros for a first chunk)."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import causal_conv, ssd
from llmctl.engine.layers.linear import Part, RowParallelLinear
from llmctl.engine.layers.recurrent_state import MambaState, StateStep, decode_kernel, run_by_sequence
from llmctl.engine.layers.stacked_rows import HeadVectors, ShardedRows, StackedColumnLinear


class GatedGroupRMSNorm(ShardedRows):
    """y = RMSNorm(x · silu(z)) over each of `groups` slices (norm_before_gate=False), or RMSNorm(x) · silu(z)
    (`gate_after`: Falcon-H1's norm_before_gate=True), in float32; a TP rank holds its groups whole."""

    def __init__(self, part: Part, groups: int, eps: float, gate_after: bool = False) -> None:
        super().__init__([part], {"weight": ()}, fill=1.0)
        self.groups, self.eps, self.gate_after = groups, eps, gate_after

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() if self.gate_after else x.float() * F.silu(gate.float())
        grouped = x.view(*x.shape[:-1], self.groups, -1)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gate_after:
            return (self.weight * grouped.view(x.shape) * F.silu(gate.float())).to(dtype)
        return self.weight * grouped.view(x.shape).to(dtype)


def gate_only(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """y · silu(z) with no norm (Falcon-H1 without mamba_rms_norm)."""
    return (x.float() * F.silu(gate.float())).to(x.dtype)


class Mamba2Mixer(HeadVectors, nn.Module):
    """TP splits the heads and the B/C groups: each rank holds its rows of z, x, B, C and dt in in_proj (and of x, B,
    C in the convolution), its heads' vectors, its groups of the norm, and out_proj's matching columns."""

    def __init__(self, mixer: Mamba2MixerSpec, eps: float, group: TPGroup, quant: QuantizationSpec | None = None
                 ) -> None:
        super().__init__()
        self.spec = mixer
        self.head_vectors = ("dt_bias", "A_log", "D")  # loaded as this rank's heads (HeadVectors)
        tp = group.size
        self.heads, self.groups = mixer.num_heads // tp, mixer.n_groups // tp
        self.inner = mixer.intermediate_size // tp
        inner, bc, heads = (Part.split(mixer.intermediate_size, group), Part.split(mixer.n_groups * mixer.state_size,
                                                                                     group), Part.split(mixer.num_heads, group))
        self.in_proj = StackedColumnLinear(mixer.hidden_size, [inner, inner, bc, bc, heads], mixer.proj_bias, quant)
        conv_kinds = {"weight": (1, mixer.conv_kernel), **({"bias": ()} if mixer.conv_bias else {})}
        self.conv1d = ShardedRows([inner, bc, bc], conv_kinds)  # depthwise: causal_conv runs it
        self.head_part = heads
        self.dt_bias = nn.Parameter(torch.zeros(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedGroupRMSNorm(inner, self.groups, eps, mixer.norm == "gated_after") \
            if mixer.norm != "none" else gate_only
        self.out_proj = RowParallelLinear(inner, mixer.hidden_size, mixer.has_out_bias, group, quant)
        # Falcon-H1's µP scales of in_proj's z, x, B, C and dt rows, over this rank's rows of each
        scales = [torch.full((part.size,), scale) for part, scale in zip([inner, inner, bc, bc, heads],
                                                                          mixer.projection_scales)]
        self.register_buffer("projection_scales", torch.cat(scales) if scales else None, persistent=False)

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.spec.state_size

    def forward(self, x: torch.Tensor, states: StateStep, layer: int) -> torch.Tensor:
        projected = self.in_proj(x * self.spec.input_scale if self.spec.input_scale != 1.0 else x)
        if self.projection_scales is not None:
            projected = projected * self.projection_scales.to(projected.dtype)
        gate, xbc, dt = projected.split([self.inner, self.conv_dim, self.heads], dim=-1)
        y = torch.empty(x.shape[0], self.heads, self.spec.head_dim, dtype=torch.float32, device=x.device)
        kernels = decode_kernel(x, states.layer(layer).ssm)
        run_by_sequence(states, layer, y,
                        lambda rows, state, slots: self._decode(xbc[rows], dt[rows], state.conv, state.ssm, slots,
                                                                kernels),
                        lambda span, state, slot: self._prefill(xbc[span], dt[span], state.conv, state.ssm, slot),
                        indexed=kernels is not None,
                        prefill_batch=lambda spans, state, slots: self._prefill_batch(xbc, dt, spans, state, slots))
        out = self.norm(y.view(x.shape[0], self.inner), gate)
        return self.out_proj(out.to(x.dtype))

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = self.spec
        groups = self.groups * spec.state_size
        x, B, C = F.silu(xbc).split([self.inner, groups, groups], dim=-1)
        return (x.reshape(-1, self.heads, spec.head_dim), B.reshape(-1, self.groups, spec.state_size),
                C.reshape(-1, self.groups, spec.state_size))

    def _decode(self, xbc: torch.Tensor, dt: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                slots: torch.Tensor | slice, kernels: ModuleType | None) -> torch.Tensor:
        bias = getattr(self.conv1d, "bias", None)
        out = causal_conv.conv_step_in_slots(xbc, conv, slots, self.conv1d.weight[:, 0], bias, kernels)
        x, B, C = self._split(out)
        if kernels is not None:  # one pass over each state, in place in its slot
            return kernels.ssd_decode(ssm, slots, x, dt, -torch.exp(self.A_log.float()), B, C, self.D, self.dt_bias,
                                      self.spec.time_step_limit)
        y, new = ssd.state_step(ssm[slots], x, dt, -torch.exp(self.A_log.float()), B, C, self.D, self.dt_bias,
                                self.spec.time_step_limit)
        if isinstance(slots, torch.Tensor) or new.dtype != ssm.dtype:  # a gathered copy, or another dtype
            ssm[slots] = new.to(ssm.dtype)
        return y

    def _prefill_batch(self, xbc: torch.Tensor, dt: torch.Tensor, spans: list[slice], state: MambaState,
                       slots: list[int]) -> list[torch.Tensor]:
        """Several sequences' prompt chunks: each one's convolution from its window, then one scan for them all."""
        bias = getattr(self.conv1d, "bias", None)
        parts = []
        for span, slot in zip(spans, slots):
            out, state.conv[slot] = causal_conv.conv_chunk(xbc[span], state.conv[slot], self.conv1d.weight[:, 0], bias)
            parts.append(self._split(out))
        index = torch.tensor(slots, device=xbc.device)
        ys, finals = ssd.chunk_scan_batch([p[0] for p in parts], [dt[span] for span in spans],
                                          -torch.exp(self.A_log.float()), [p[1] for p in parts], [p[2] for p in parts],
                                          self.D, self.dt_bias, self.spec.chunk_size, state.ssm[index],
                                          self.spec.time_step_limit)
        state.ssm[index] = finals.to(state.ssm.dtype)
        return ys

    def _prefill(self, xbc: torch.Tensor, dt: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                 slot: int) -> torch.Tensor:
        bias = getattr(self.conv1d, "bias", None)
        out, conv[slot] = causal_conv.conv_chunk(xbc, conv[slot], self.conv1d.weight[:, 0], bias)
        x, B, C = self._split(out)
        y, final = ssd.chunk_scan(x, dt, -torch.exp(self.A_log.float()), B, C, self.D, self.dt_bias,
                                 self.spec.chunk_size, ssm[slot], self.spec.time_step_limit)
        ssm[slot] = final.to(ssm.dtype)
        return y
