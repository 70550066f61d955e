"""The Mamba2 mixer's shape as each family's config.json names it (Mamba2, Granite 4.0-H, Nemotron-H, Falcon-H1),
and the state one sequence keeps in each such layer: the causal convolution's last `conv_kernel - 1` inputs and the
SSM state, held per sequence instead of K/V per token (vLLM's MambaStateShapeCalculator.mamba2_state_shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# config key of each field, per naming: Mamba2's own, then the hybrids' `mamba_` prefixed names
_NAMES = {
    "num_heads": ("num_heads", "mamba_n_heads", "mamba_num_heads"),
    "head_dim": ("head_dim", "mamba_d_head", "mamba_head_dim"),
    "state_size": ("state_size", "mamba_d_state", "ssm_state_size"),
    "n_groups": ("n_groups", "mamba_n_groups"),
    "conv_kernel": ("conv_kernel", "mamba_d_conv"),
    "expand": ("expand", "mamba_expand"),
    "chunk_size": ("chunk_size", "mamba_chunk_size"),
    "conv_bias": ("use_conv_bias", "mamba_conv_bias"),
    "proj_bias": ("use_bias", "mamba_proj_bias"),
}
_PREFIXED_FIRST = ("granitemoehybrid", "falcon_h1", "nemotron_h")  # their plain `head_dim` is attention's


@dataclass(frozen=True)
class Mamba2MixerSpec:
    hidden_size: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool
    proj_bias: bool
    ssm_state_dtype: str | None = None  # None: the model's dtype (vLLM's --mamba-ssm-cache-dtype auto)
    time_step_limit: tuple[float, float] = (0.0, float("inf"))
    kind: str = "mamba2"
    label: str = "Mamba2"
    # the output's gate and norm: "gated" RMSNorm(y · silu(z)) per group (mamba_ssm's norm_before_gate=False),
    # "gated_after" RMSNorm(y) · silu(z), "none" y · silu(z) and no norm (Falcon-H1's mamba_rms_norm false)
    norm: str = "gated"
    out_bias: bool | None = None  # out_proj's bias where it differs from in_proj's (Falcon-H1's projectors_bias)
    input_scale: float = 1.0  # Falcon-H1's ssm_in_multiplier: the input × this
    projection_scales: tuple[float, ...] = ()  # Falcon-H1's ssm_multipliers: in_proj's z, x, B, C, dt rows × these

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the causal convolution runs over: x, B and C."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def projection_size(self) -> int:
        """in_proj's rows: the gate z, then x, B, C, then one dt per head."""
        return self.intermediate_size + self.conv_dim + self.num_heads

    @property
    def has_out_bias(self) -> bool:
        return self.proj_bias if self.out_bias is None else self.out_bias

    @property
    def norm_size(self) -> int:
        return 0 if self.norm == "none" else self.intermediate_size

    @property
    def params(self) -> int:
        """in_proj, the convolution, dt_bias / A_log / D, the gated norm and out_proj of one layer."""
        h, inner = self.hidden_size, self.intermediate_size
        projections = (h + self.proj_bias) * self.projection_size + (inner + self.has_out_bias) * h
        return projections + self.conv_dim * (self.conv_kernel + self.conv_bias) + 3 * self.num_heads + self.norm_size

    def rank_linears(self, tp: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of in_proj and out_proj on one TP rank (split by heads, as vLLM)."""
        return (self.hidden_size, self.projection_size // tp), (self.intermediate_size // tp, self.hidden_size)

    def rank_other_params(self, tp: int) -> int:
        in_bias = self.projection_size if self.proj_bias else 0
        out_bias = self.hidden_size if self.has_out_bias else 0  # out_proj is row-parallel: its bias on every rank
        return (self.conv_dim * (self.conv_kernel + self.conv_bias) + 3 * self.num_heads + self.norm_size
                + in_bias) // tp + out_bias

    def tp_problem(self, tp: int) -> str | None:
        if self.num_heads % tp or self.n_groups % tp:  # (vLLM also replicates groups; llmctl splits them)
            return f"{self.num_heads} Mamba2 heads in {self.n_groups} B/C groups cannot be split over TP {tp}"
        return None

    def describe(self) -> str:
        return (f"{self.num_heads} heads × {self.head_dim}, state {self.state_size}, {self.n_groups} B/C groups, "
                f"conv kernel {self.conv_kernel}")

    def conv_state_shape(self, tp: int = 1) -> tuple[int, int]:
        return self.conv_dim // tp, self.conv_kernel - 1

    def ssm_state_shape(self, tp: int = 1) -> tuple[int, int, int]:
        return self.num_heads // tp, self.head_dim, self.state_size

    def state_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """One sequence, one layer, on one TP rank: the convolution's window and the SSM state."""
        conv = self.conv_dim // tp * (self.conv_kernel - 1)
        ssm = self.num_heads // tp * self.head_dim * self.state_size
        ssm_bytes = 4 if self.ssm_state_dtype == "float32" else dtype_bytes
        return conv * dtype_bytes + ssm * ssm_bytes


def _read(cfg: dict[str, Any], field: str, prefixed_first: bool) -> Any:
    names = _NAMES[field]
    order = names[1:] + names[:1] if prefixed_first else names
    return next((cfg[name] for name in order if cfg.get(name) is not None), None)


def _number(value: Any) -> float:
    """A float as config.json holds it: a number, or transformers' {"__float__": "Infinity"} for infinities."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


def mamba2_mixer(cfg: dict[str, Any], model_type: str) -> Mamba2MixerSpec | None:
    """The Mamba2 mixer of a config that has one, or None (Mamba 1, gated DeltaNet and others are not Mamba2)."""
    if model_type not in ("mamba2", "granitemoehybrid", "nemotron_h", "falcon_h1"):
        return None
    prefixed = model_type in _PREFIXED_FIRST
    values = {field: _read(cfg, field, prefixed) for field in _NAMES}
    if model_type == "nemotron_h":  # its mixer's projections take the model's use_bias, not mamba_proj_bias
        values["proj_bias"] = cfg.get("use_bias")
    if values["head_dim"] == "auto" and values["num_heads"]:  # Falcon-H1: the inner size over the heads
        inner = cfg.get("mamba_d_ssm") or int(values["expand"] or 2) * int(cfg["hidden_size"])
        values["head_dim"] = int(inner) // int(values["num_heads"])
    if any(values[field] is None for field in ("num_heads", "head_dim", "state_size", "conv_kernel")):
        return None
    limit = [_number(v) for v in cfg.get("time_step_limit") or (0.0, float("inf"))]
    return Mamba2MixerSpec(
        hidden_size=int(cfg["hidden_size"]), num_heads=int(values["num_heads"]), head_dim=int(values["head_dim"]),
        state_size=int(values["state_size"]), n_groups=int(values["n_groups"] or 1),
        conv_kernel=int(values["conv_kernel"]), chunk_size=int(values["chunk_size"] or 256),
        conv_bias=bool(values["conv_bias"] if values["conv_bias"] is not None else True),
        proj_bias=bool(values["proj_bias"] or False), ssm_state_dtype=cfg.get("mamba_ssm_cache_dtype"),
        time_step_limit=(float(limit[0]), float(limit[1])), **(_falcon_h1(cfg) if model_type == "falcon_h1" else {}))


def _falcon_h1(cfg: dict[str, Any]) -> dict[str, Any]:
    """Falcon-H1's mixer: its norm optional and placed by mamba_norm_before_gate, out_proj's own bias, µP scales."""
    norm = "none" if not cfg.get("mamba_rms_norm", False) else \
        "gated_after" if cfg.get("mamba_norm_before_gate", True) else "gated"
    return dict(norm=norm, out_bias=bool(cfg.get("projectors_bias", False)),
                input_scale=float(cfg.get("ssm_in_multiplier") or 1.0),
                projection_scales=tuple(float(m) for m in cfg.get("ssm_multipliers") or (1.0,) * 5))
