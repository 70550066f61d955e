"""The fp8 KV cache formats: --kv-cache-dtype fp8 (e4m3) and fp8_e5m2, each with a scale of 1.0, as vLLM
uses when a checkpoint carries no KV scales. Shared by the Triton store kernels and the torch backend."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fp8Format:
    dtype: torch.dtype
    limit: float  # the largest finite value: stored K/V are clamped to it
    mantissa_bits: int
    min_exponent: int  # of the smallest normal value (subnormals below it keep its quantum)


E4M3 = Fp8Format(torch.float8_e4m3fn, 448.0, 3, -6)
E5M2 = Fp8Format(torch.float8_e5m2, 57344.0, 2, -14)
FP8_FORMATS = {f.dtype: f for f in (E4M3, E5M2)}


def fp8_format(dtype: torch.dtype) -> Fp8Format | None:
    """The cache's fp8 format; None for a cache in a float type."""
    return FP8_FORMATS.get(dtype)
