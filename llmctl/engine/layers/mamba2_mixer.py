"""Mamba2's mixer (the SSD layer of Mamba2, Granite 4.0-H, Nemotron-H, Falcon-H1) on the engine's flat batch:
in_proj to the gate z, x·B·C and dt; a causal depthwise convolution over x·B·C; the selective scan; a gated,
grouped RMSNorm; out_proj. Each sequence's convolution window and SSM state live in the state cache
(llmctl.engine.layers.recurrent_state): decodes update theirs together, prompt chunks scan one sequence at a time
from the state their previous chunk left (zeros for a first chunk)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.mamba import Mamba2MixerSpec
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import causal_conv, ssd
from llmctl.engine.layers.linear import ColumnParallelLinear, Part, RowParallelLinear
from llmctl.engine.layers.recurrent_state import StateStep, run_by_sequence


class GatedGroupRMSNorm(nn.Module):
    """y = RMSNorm(x · silu(z)) over each of `groups` slices (norm_before_gate=False), in float32."""

    def __init__(self, size: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.groups, self.eps = groups, eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float() * F.silu(gate.float())
        grouped = x.view(*x.shape[:-1], self.groups, -1)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * grouped.view(x.shape).to(dtype)


class Mamba2Mixer(nn.Module):
    def __init__(self, mixer: Mamba2MixerSpec, eps: float, quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        self.spec = mixer
        whole = TPGroup()  # one rank: the engine refuses TP for these layers (llmctl.engine.worker.load_flags)
        self.in_proj = ColumnParallelLinear(mixer.hidden_size, [Part.split(mixer.projection_size, whole)],
                                            mixer.proj_bias, quant)
        self.conv1d = nn.Conv1d(mixer.conv_dim, mixer.conv_dim, mixer.conv_kernel, groups=mixer.conv_dim,
                                bias=mixer.conv_bias)  # holds the weights (causal_conv runs it)
        self.dt_bias = nn.Parameter(torch.zeros(mixer.num_heads))
        self.A_log = nn.Parameter(torch.zeros(mixer.num_heads))
        self.D = nn.Parameter(torch.ones(mixer.num_heads))
        self.norm = GatedGroupRMSNorm(mixer.intermediate_size, mixer.n_groups, eps)
        self.out_proj = RowParallelLinear(Part.split(mixer.intermediate_size, whole), mixer.hidden_size,
                                          mixer.proj_bias, whole, quant)

    def forward(self, x: torch.Tensor, states: StateStep, layer: int) -> torch.Tensor:
        spec = self.spec
        gate, xbc, dt = self.in_proj(x).split([spec.intermediate_size, spec.conv_dim, spec.num_heads], dim=-1)
        y = torch.empty(x.shape[0], spec.num_heads, spec.head_dim, dtype=torch.float32, device=x.device)
        run_by_sequence(states, layer, y,
                        lambda rows, state, slots: self._decode(xbc[rows], dt[rows], state.conv, state.ssm, slots),
                        lambda span, state, slot: self._prefill(xbc[span], dt[span], state.conv, state.ssm, slot))
        out = self.norm(y.view(x.shape[0], spec.intermediate_size), gate)
        return self.out_proj(out.to(x.dtype))

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = self.spec
        groups = spec.n_groups * spec.state_size
        x, B, C = F.silu(xbc).split([spec.intermediate_size, groups, groups], dim=-1)
        return (x.reshape(-1, spec.num_heads, spec.head_dim), B.reshape(-1, spec.n_groups, spec.state_size),
                C.reshape(-1, spec.n_groups, spec.state_size))

    def _decode(self, xbc: torch.Tensor, dt: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
        out, conv[slots] = causal_conv.conv_step(xbc, conv[slots], self.conv1d.weight[:, 0], self.conv1d.bias)
        x, B, C = self._split(out)
        y, new = ssd.state_step(ssm[slots], x, dt, -torch.exp(self.A_log.float()), B, C, self.D, self.dt_bias,
                                self.spec.time_step_limit)
        ssm[slots] = new.to(ssm.dtype)
        return y

    def _prefill(self, xbc: torch.Tensor, dt: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor,
                 slot: int) -> torch.Tensor:
        out, conv[slot] = causal_conv.conv_chunk(xbc, conv[slot], self.conv1d.weight[:, 0], self.conv1d.bias)
        x, B, C = self._split(out)
        y, final = ssd.chunk_scan(x, dt, -torch.exp(self.A_log.float()), B, C, self.D, self.dt_bias,
                                 self.spec.chunk_size, ssm[slot], self.spec.time_step_limit)
        ssm[slot] = final.to(ssm.dtype)
        return y
