"""Which attention backend `llmctl serve` runs for a model: one answer for `inspect`, the
startup log and the engine, so they cannot disagree; and every combination of backend, device,
dtype and KV-cache format the engine refuses (`engine_backend`). Torch-free: `inspect` imports it.

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
from typing import TYPE_CHECKING

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.kernels.limits import HALF_VECTOR_QUERY_LIMIT, SHORT_QUERY_LIMIT, VECTOR_QUERY_LIMIT
from llmctl.settings import kv_cache_format

if TYPE_CHECKING:
    import torch

    from llmctl.engine.layers.attention import AttentionBackend

BACKENDS = ("cpu", "torch", "triton")


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "cpu" | "torch" | "triton"
    reason: str


def _cuda_available() -> bool:
    """torch is imported only where a GPU's device files exist (llmctl.plan.gpus)."""
    from llmctl.plan.gpus import detect_local_gpus

    return detect_local_gpus() is not None


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _cpu_kernel_problem() -> str | None:
    """Why the C++ CPU kernel cannot be built here, without building it (inspect must stay fast)."""
    from llmctl.kernels.build_tools import missing_tools

    return missing_tools()


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


def engine_backend(config: EngineConfig, spec: ModelSpec, cuda: bool, dtype: str) -> BackendChoice:
    """The backend the engine runs for `dtype` (the model's, resolved), refusing in one line each combination
    of backend, device, dtype and KV-cache format that cannot work."""
    choice = choose_attention_backend(spec, cuda=cuda, requested=config.attention_backend,
                                      kv_cache_dtype=config.kv_cache_dtype)
    kv = kv_cache_format(config.kv_cache_dtype)
    if choice.backend == "mla":
        _check_latent_cache(config, spec)
    other_width = kv.torch_name not in (None, dtype) and not kv.fp8  # a 16-bit cache beside another model dtype
    if choice.backend == "triton":
        if other_width:
            raise EngineConfigError(f"--kv-cache-dtype {kv.name}: the Triton kernels read a cache in the model's "
                                    f"dtype ({dtype}) or fp8; use --kv-cache-dtype auto, fp8 or fp8_e5m2, or --dtype "
                                    "to match")
        if problem := triton_usable(cuda):
            raise EngineConfigError(f"--attention-backend triton: {problem}")
    if choice.backend != "cpu":
        return choice
    if cuda:
        raise EngineConfigError("--attention-backend cpu: the C++ kernel runs on CPU tensors; on a GPU use triton "
                                "(the default) or torch")
    if kv.fp8:
        raise EngineConfigError("--attention-backend cpu: the C++ kernel reads caches in the model's dtype; "
                                f"with --kv-cache-dtype {kv.name} use --attention-backend torch")
    if other_width and dtype != "float32":  # the kernel narrows float32 rows only
        why = f"the C++ CPU kernel reads a {kv.name} cache under float32 models only"
        if config.attention_backend == "cpu":
            raise EngineConfigError(f"--attention-backend cpu: {why}; use --attention-backend torch")
        return torch_fallback(spec, why)
    return choice


def _check_latent_cache(config: EngineConfig, spec: ModelSpec) -> None:
    if config.attention_backend != "auto":
        raise EngineConfigError(f"--attention-backend {config.attention_backend}: {spec.model_type} uses "
                                "multi-head latent attention, whose cache holds latents, not K/V pages; leave "
                                "--attention-backend at auto")
    if config.kv_cache_dtype != "auto":
        raise EngineConfigError(f"--kv-cache-dtype {config.kv_cache_dtype}: the latent cache of MLA models is "
                                "kept in the model's dtype; leave --kv-cache-dtype at auto")


def create_backend(name: str, dtype: torch.dtype | None = None, head_dim: int = 64) -> AttentionBackend:
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
        import torch

        from llmctl.engine.layers.cpu_attention import CPUAttention

        return CPUAttention(dtype or torch.float32, head_dim)
    raise ValueError(f"unknown attention backend {name!r}; available: cpu, torch, triton")
