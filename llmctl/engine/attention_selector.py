"""Which attention backend `llmctl serve` runs for a model: one answer for `inspect`, the
startup log and the engine, so they cannot disagree.

- `triton`: llmctl's Triton paged-attention kernel (`llmctl.kernels.attention`), reading the
  paged KV cache in place. The default on CUDA GPUs.
- `cpu`: llmctl's C++ paged-attention kernel (`llmctl.kernels.cpu`) for decodes and prompt
  chunks up to a limit (llmctl.engine.layers.cpu_attention), reading the KV pages in place;
  longer prompts use torch SDPA. The default on CPUs
  (Triton kernels run there only in its slow, test-only interpreter). Built on first use.
- `torch`: SDPA over KV pages gathered into a padded copy: the reference, and the fallback
  where the C++ kernel cannot be built or the KV cache is fp8.
- `mla`: multi-head latent attention (DeepSeek-V2/V3) over a cache of latents
  (llmctl.engine.layers.mla_attention), on CPUs and GPUs alike: the one backend of MLA models.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import torch

from llmctl.checkpoint.spec import ModelSpec
from llmctl.settings import kv_cache_format
from llmctl.engine.layers.attention import AttentionBackend
from llmctl.engine.layers.cpu_attention import HALF_VECTOR_QUERY_LIMIT, SHORT_QUERY_LIMIT, VECTOR_QUERY_LIMIT

BACKENDS = ("cpu", "torch", "triton")


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "cpu" | "torch" | "triton"
    reason: str


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _cpu_kernel_problem() -> str | None:
    """Why the C++ CPU kernel cannot be built here, without building it (inspect must stay fast)."""
    from llmctl.kernels import cpu

    return cpu.missing_tools()


def choose_attention_backend(spec: ModelSpec, *, cuda: bool | None = None, requested: str = "auto",
                             kv_cache_dtype: str = "auto") -> BackendChoice:
    """`requested` is --attention-backend: auto, cpu, torch or triton."""
    cuda = _cuda_available() if cuda is None else cuda
    if spec.attention.kind == "MLA":
        return BackendChoice("mla", MLA_REASON)  # the loader refuses another --attention-backend
    alibi = spec.positional.kind == "alibi"
    torch_sdpa = _torch_sdpa(spec)
    kernel = f"{spec.positional.describe()}: llmctl's Triton paged-attention kernel, reading the KV pages in place" + \
        (" and adding the ALiBi bias itself" if alibi else "")
    cpu_kernel = f"{spec.positional.describe()}: llmctl's C++ paged-attention kernel for decodes and prompt chunks, " \
        "reading the KV pages in place" + (" and adding the ALiBi bias itself" if alibi else "") + "; torch SDPA " \
        f"for chunks over {VECTOR_QUERY_LIMIT} new tokens ({HALF_VECTOR_QUERY_LIMIT} in bfloat16 and float16; without " \
        "AVX-512 or with head sizes not a multiple of 16: for fresh prompts, and " \
        f"for chunks over {SHORT_QUERY_LIMIT})"
    if requested == "torch":
        return BackendChoice("torch", f"{torch_sdpa} (--attention-backend torch)")
    if requested == "cpu":
        return BackendChoice("cpu", f"{cpu_kernel} (--attention-backend cpu)")
    if requested == "triton":
        where = "" if cuda else "; on CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1, slow, for tests)"
        return BackendChoice("triton", f"{kernel} (--attention-backend triton{where})")
    if cuda and _triton_installed():
        return BackendChoice("triton", f"{kernel} (the default on CUDA)")
    if cuda:
        return BackendChoice("torch", f"{torch_sdpa} (triton is not installed)")
    if kv_cache_format(kv_cache_dtype).fp8:
        return torch_fallback(spec, "the C++ CPU kernel reads caches in the model's dtype, not fp8")
    problem = _cpu_kernel_problem()
    if problem:
        return torch_fallback(spec, f"the C++ CPU kernel cannot be built: {problem}")
    return BackendChoice("cpu", f"{cpu_kernel} (the default on CPUs)")


MLA_REASON = ("multi-head latent attention: the query absorbs kv_b_proj, every head attends over the paged "
              "latent cache (kv_lora_rank + qk_rope_head_dim per token) with torch SDPA")


def torch_fallback(spec: ModelSpec, why: str) -> BackendChoice:
    """The torch backend where the C++ CPU kernel cannot run, saying why."""
    return BackendChoice("torch", f"{_torch_sdpa(spec)} ({why})")


def _torch_sdpa(spec: ModelSpec) -> str:
    return f"{spec.positional.describe()}: torch SDPA over gathered KV pages" + \
        (" with the ALiBi bias as an additive mask" if spec.positional.kind == "alibi" else "")


def triton_usable(cuda: bool) -> str | None:
    """Why the Triton backend cannot run here, or None."""
    if not _triton_installed():
        return "triton is not installed (pip install 'triton>=3.9'): use --attention-backend torch"
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return ("Triton kernels need a CUDA GPU; on CPU tensors they run only in Triton's interpreter "
                "(TRITON_INTERPRET=1, slow, for tests): use --attention-backend torch")
    return None


def create_backend(name: str, dtype: torch.dtype = torch.float32, head_dim: int = 64) -> AttentionBackend:
    """The backend `name`; the cpu backend picks which prompts its kernel takes by dtype and head size."""
    if name == "triton":
        from llmctl.engine.layers.triton_attention import TritonAttention

        return TritonAttention()
    if name == "torch":
        from llmctl.engine.layers.torch_attention import TorchAttention

        return TorchAttention()
    if name == "mla":
        from llmctl.engine.layers.mla_attention import LatentAttention

        return LatentAttention()
    if name == "cpu":
        from llmctl.engine.layers.cpu_attention import CPUAttention

        return CPUAttention(dtype, head_dim)
    raise ValueError(f"unknown attention backend {name!r}; available: cpu, torch, triton")
