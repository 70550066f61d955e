"""The Mamba (1) mixer's shape as config.json names it (Mamba, Falcon-Mamba, and Jamba's `mamba_` keys), and the state
one sequence keeps in each such layer: the causal convolution's last `conv_kernel - 1` inputs and the selective
scan's state, `state_size` values per inner channel (vLLM's MambaStateShapeCalculator.mamba1_state_shape)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Mamba1MixerSpec:
    hidden_size: int
    intermediate_size: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool
    proj_bias: bool
    # RMSNorms on x_proj's dt, B and C: "none" (Mamba), "weightless" (Falcon-Mamba's mixer_rms_eps), "weighted" (Jamba)
    bc_dt_norm: str = "none"
    norm_eps: float = 1e-6
    ssm_state_dtype: str | None = None
    kind: str = "mamba"
    label: str = "Mamba"

    @property
    def x_proj_size(self) -> int:
        """x_proj's outputs: dt's low rank, then B and C."""
        return self.dt_rank + 2 * self.state_size

    @property
    def norm_params(self) -> int:
        return self.x_proj_size if self.bc_dt_norm == "weighted" else 0

    @property
    def params(self) -> int:
        """in_proj, the convolution, x_proj, dt_proj, A_log, D, out_proj (and Jamba's norms) of one layer."""
        h, inner = self.hidden_size, self.intermediate_size
        projections = (h + self.proj_bias) * 2 * inner + inner * self.x_proj_size + (self.dt_rank + 1) * inner + \
            (inner + self.proj_bias) * h
        return projections + inner * (self.conv_kernel + self.conv_bias) + inner * (self.state_size + 1) + \
            self.norm_params

    def rank_linears(self, tp: int) -> tuple[tuple[int, int], ...]:
        """(in, out) on one TP rank, split by inner channel as vLLM: in_proj, x_proj (row-parallel), dt_proj,
        out_proj."""
        inner = self.intermediate_size // tp
        return (self.hidden_size, 2 * inner), (inner, self.x_proj_size), (self.dt_rank, inner), (inner, self.hidden_size)

    def rank_other_params(self, tp: int) -> int:
        inner = self.intermediate_size // tp
        biases = 2 * inner * self.proj_bias + self.hidden_size * self.proj_bias  # out_proj's whole on every rank
        return inner * (self.conv_kernel + self.conv_bias) + inner + inner * (self.state_size + 1) + biases + \
            self.norm_params

    def tp_problem(self, tp: int) -> str | None:
        if self.intermediate_size % tp:
            return f"{self.intermediate_size} Mamba inner channels cannot be split over TP {tp}"
        return None

    def describe(self) -> str:
        return (f"{self.intermediate_size} inner channels, state {self.state_size}, dt rank {self.dt_rank}, "
                f"conv kernel {self.conv_kernel}")

    def conv_state_shape(self, tp: int = 1) -> tuple[int, int]:
        return self.intermediate_size // tp, self.conv_kernel - 1

    def ssm_state_shape(self, tp: int = 1) -> tuple[int, int]:
        return self.intermediate_size // tp, self.state_size

    def state_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """One sequence, one layer, on one TP rank: the convolution's window and the scan's state."""
        inner = self.intermediate_size // tp
        ssm_bytes = 4 if self.ssm_state_dtype == "float32" else dtype_bytes
        return inner * (self.conv_kernel - 1) * dtype_bytes + inner * self.state_size * ssm_bytes


def mamba1_mixer(cfg: dict[str, Any], model_type: str) -> Mamba1MixerSpec | None:
    """The Mamba (1) mixer of a config that has one, or None."""
    if model_type == "jamba":
        return _jamba(cfg)
    if model_type not in ("mamba", "falcon_mamba"):
        return None
    hidden = int(cfg["hidden_size"])
    inner = int(cfg.get("intermediate_size") or int(cfg.get("expand") or 2) * hidden)
    rank = cfg.get("time_step_rank")
    dt_rank = math.ceil(hidden / 16) if rank in (None, "auto") else int(rank)
    falcon = model_type == "falcon_mamba"
    return Mamba1MixerSpec(
        hidden_size=hidden, intermediate_size=inner, state_size=int(cfg.get("state_size") or 16),
        conv_kernel=int(cfg.get("conv_kernel") or 4), dt_rank=dt_rank, conv_bias=bool(cfg.get("use_conv_bias", True)),
        proj_bias=bool(cfg.get("use_bias", False)), bc_dt_norm="weightless" if falcon else "none",
        norm_eps=float(cfg.get("mixer_rms_eps") or 1e-6), ssm_state_dtype=cfg.get("mamba_ssm_cache_dtype"))


def _jamba(cfg: dict[str, Any]) -> Mamba1MixerSpec:
    """Jamba's `mamba_` keys; its dt, B and C normed with weights (rms_norm_eps)."""
    hidden = int(cfg["hidden_size"])
    rank = cfg.get("mamba_dt_rank")
    return Mamba1MixerSpec(
        hidden_size=hidden, intermediate_size=int(cfg.get("mamba_expand") or 2) * hidden,
        state_size=int(cfg.get("mamba_d_state") or 16), conv_kernel=int(cfg.get("mamba_d_conv") or 4),
        dt_rank=math.ceil(hidden / 16) if rank in (None, "auto") else int(rank),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)), proj_bias=bool(cfg.get("mamba_proj_bias", False)),
        bc_dt_norm="weighted", norm_eps=float(cfg.get("rms_norm_eps") or 1e-6))
