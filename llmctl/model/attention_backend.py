"""Which attention backend `llmctl serve` runs for a model: one answer for `inspect`, the
startup log and the engine, so they cannot disagree.

- `triton`: llmctl's Triton paged-attention kernel (`llmctl.kernels.attention`), reading the
  paged KV cache in place. The default on CUDA GPUs.
- `torch`: SDPA over KV pages gathered into a padded copy. The default on CPUs, where Triton
  kernels run only in its (slow, test-only) interpreter.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from llmctl.model.spec import ModelSpec

BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "torch" | "triton"
    reason: str


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def choose_attention_backend(spec: ModelSpec, *, cuda: bool | None = None, requested: str = "auto") -> BackendChoice:
    """`requested` is --attention-backend: auto, torch or triton."""
    cuda = _cuda_available() if cuda is None else cuda
    alibi = spec.positional.kind == "alibi"
    torch_sdpa = f"{spec.positional.describe()}: torch SDPA over gathered KV pages" + \
        (" with the ALiBi bias as an additive mask" if alibi else "")
    kernel = f"{spec.positional.describe()}: llmctl's Triton paged-attention kernel, reading the KV pages in place" + \
        (" and adding the ALiBi bias itself" if alibi else "")
    if requested == "torch":
        return BackendChoice("torch", f"{torch_sdpa} (--attention-backend torch)")
    if requested == "triton":
        where = "" if cuda else "; on CPU tensors only in Triton's interpreter (TRITON_INTERPRET=1, slow, for tests)"
        return BackendChoice("triton", f"{kernel} (--attention-backend triton{where})")
    if cuda and _triton_installed():
        return BackendChoice("triton", f"{kernel} (the default on CUDA)")
    if cuda:
        return BackendChoice("torch", f"{torch_sdpa} (triton is not installed)")
    return BackendChoice("torch", f"{torch_sdpa} (no GPU: the Triton kernels need CUDA)")


def triton_usable(cuda: bool) -> str | None:
    """Why the Triton backend cannot run here, or None."""
    if not _triton_installed():
        return "triton is not installed (pip install 'triton>=3.9'): use --attention-backend torch"
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return ("Triton kernels need a CUDA GPU; on CPU tensors they run only in Triton's interpreter "
                "(TRITON_INTERPRET=1, slow, for tests): use --attention-backend torch")
    return None
