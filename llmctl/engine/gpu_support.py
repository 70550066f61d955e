"""Refuse, before the model is built, what llmctl's Triton kernels cannot run on this GPU
(the limits themselves live with the kernels: `llmctl.kernels.limits`)."""

from __future__ import annotations

import torch

from llmctl.engine.errors import EngineConfigError
from llmctl.kernels.limits import kernel_refusal
from llmctl.settings import kv_cache_format


def check_this_gpu(device: torch.device, dtype: torch.dtype, kv_cache_dtype: str, padded_dim: int, rows: int) -> None:
    """Refuse, in one line and before the model is built, what the kernels cannot run on this GPU
    (`rows`: the largest program's query rows, `padded_dim`: the head dim as the kernel pads it)."""
    major, minor = torch.cuda.get_device_capability(device)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    kv = {"float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}.get(kv_cache_format(kv_cache_dtype).torch_name or "", name)
    problem = kernel_refusal(10 * major + minor, name, kv, padded_dim, rows)
    if problem:
        raise EngineConfigError(problem)
