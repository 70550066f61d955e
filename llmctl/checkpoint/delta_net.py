"""The gated DeltaNet linear attention of Qwen3-Next and Qwen3.5 as config.json names it (`linear_*` keys), and the
state one sequence keeps in each such layer: the causal convolution's last `conv_kernel - 1` inputs of q, k and v,
and the delta rule's state, a k_dim × v_dim matrix per value head (vLLM's gated_delta_net_state_shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    grouped: bool = True  # Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head; Qwen3.5: in_proj_qkv, _z, _b, _a
    kind: str = "gated_deltanet"
    label: str = "gated DeltaNet"

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels the causal convolution runs over: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def params(self) -> int:
        """in_proj_qkvz, in_proj_ba, the convolution (no bias), dt_bias and A_log, the gated norm, out_proj."""
        h = self.hidden_size
        projections = h * (2 * self.key_dim + 2 * self.value_dim) + h * 2 * self.num_v_heads + self.value_dim * h
        return projections + self.conv_dim * self.conv_kernel + 2 * self.num_v_heads + self.head_v_dim

    def rank_linears(self, tp: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of each projection one TP rank holds: the input ones split by output, out_proj by input."""
        h = self.hidden_size
        return ((h, (2 * self.key_dim + 2 * self.value_dim) // tp), (h, 2 * self.num_v_heads // tp),
                (self.value_dim // tp, h))

    def rank_other_params(self, tp: int) -> int:
        return (self.conv_dim * self.conv_kernel + 2 * self.num_v_heads) // tp + self.head_v_dim

    def conv_state_shape(self, tp: int = 1) -> tuple[int, int]:
        return self.conv_dim // tp, self.conv_kernel - 1

    def ssm_state_shape(self, tp: int = 1) -> tuple[int, int, int]:
        return self.num_v_heads // tp, self.head_k_dim, self.head_v_dim

    @property
    def ssm_state_dtype(self) -> str | None:
        return None  # the model's dtype, as vLLM's default

    def state_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """One sequence, one layer, on one TP rank: the convolution's window and the delta rule's state."""
        conv = self.conv_dim // tp * (self.conv_kernel - 1)
        return (conv + self.num_v_heads // tp * self.head_k_dim * self.head_v_dim) * dtype_bytes

    def tp_problem(self, tp: int) -> str | None:
        if self.num_k_heads % tp or self.num_v_heads % tp:
            return f"{self.num_k_heads} key / {self.num_v_heads} value DeltaNet heads cannot be split over TP {tp}"
        return None

    def describe(self) -> str:
        return (f"{self.num_k_heads} key heads × {self.head_k_dim}, {self.num_v_heads} value heads × "
                f"{self.head_v_dim}, conv kernel {self.conv_kernel}")


def gated_delta_net(cfg: dict[str, Any], model_type: str) -> GatedDeltaNetSpec | None:
    """The gated DeltaNet of a config that has one (Qwen3-Next's `linear_*` keys), or None."""
    names = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim")
    if any(cfg.get(name) is None for name in names):
        return None
    k_heads, v_heads, k_dim, v_dim, kernel = (int(cfg[name]) for name in names)
    return GatedDeltaNetSpec(int(cfg["hidden_size"]), k_heads, v_heads, k_dim, v_dim, kernel,
                             grouped=not model_type.startswith("qwen3_5"))
