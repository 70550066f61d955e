"""GPU catalog and local GPU detection.

``memory_bytes`` is what the driver reports as total memory (``torch.cuda.mem_get_info`` /
vLLM's ``total_gpu_memory``), not the marketing number: an "80 GB" H100 reports about
79.2 GiB. vLLM multiplies this number by ``--gpu-memory-utilization``, so the planner does too.
The values vary by ±0.3% with driver version and ECC; a locally detected GPU is measured.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

from llmctl.errors import LlmctlError
from llmctl.units import GiB


@dataclass(frozen=True)
class GpuType:
    key: str  # catalog name, e.g. "h100-80gb"
    name: str  # as vendors and `nvidia-smi` spell it
    memory_bytes: int  # total memory the driver reports
    interconnect: str  # "NVLink", "PCIe", "Infinity Fabric"
    fp8: bool  # native FP8 tensor cores (Hopper, Ada, Blackwell, CDNA3)
    bf16: bool = True
    aliases: tuple[str, ...] = ()

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


def _gib(value: float) -> int:
    return int(round(value * GiB))


# Totals as the driver reports them (from vLLM startup logs and PyTorch OOM messages).
GPU_CATALOG: tuple[GpuType, ...] = (
    GpuType("h100-80gb", "NVIDIA H100 80GB HBM3 (SXM)", _gib(79.19), "NVLink", True,
            aliases=("h100", "h100-sxm", "h100-80gb-sxm", "h100-sxm-80gb", "h100-80gb-hbm3")),
    GpuType("h100-80gb-pcie", "NVIDIA H100 PCIe 80GB", _gib(79.19), "PCIe", True,
            aliases=("h100-pcie", "h100-pcie-80gb")),
    GpuType("h200-141gb", "NVIDIA H200 141GB HBM3e", _gib(139.80), "NVLink", True,
            aliases=("h200", "h200-sxm", "h200-nvl")),
    GpuType("b200", "NVIDIA B200 180GB HBM3e", _gib(178.35), "NVLink", True, aliases=("b200-180gb", "b200-192gb")),
    GpuType("a100-80gb", "NVIDIA A100-SXM4-80GB", _gib(79.15), "NVLink", False,
            aliases=("a100-80gb-sxm", "a100-sxm4-80gb", "a100-80gb-pcie", "a100-pcie-80gb")),
    GpuType("a100-40gb", "NVIDIA A100 40GB", _gib(39.39), "NVLink", False,
            aliases=("a100", "a100-sxm4-40gb", "a100-pcie-40gb", "a100-40gb-sxm", "a100-40gb-pcie")),
    GpuType("l40s", "NVIDIA L40S 48GB", _gib(44.39), "PCIe", True, aliases=("l40s-48gb",)),
    GpuType("l4", "NVIDIA L4 24GB", _gib(22.05), "PCIe", True, aliases=("l4-24gb",)),
    GpuType("a10g", "NVIDIA A10G 24GB", _gib(22.06), "PCIe", False, aliases=("a10g-24gb", "a10", "a10-24gb")),
    GpuType("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", _gib(23.64), "PCIe", True,
            aliases=("4090", "rtx4090", "geforce-rtx-4090")),
    GpuType("mi300x", "AMD Instinct MI300X 192GB", _gib(191.98), "Infinity Fabric", True,
            aliases=("mi300x-192gb", "amd-mi300x")),
)
DEFAULT_GPU_KEY = "h100-80gb"


def _normalize(name: str) -> str:
    text = name.lower().replace("nvidia", "").replace("geforce", "").replace("amd instinct", "")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def lookup_gpu(name: str) -> GpuType:
    wanted = _normalize(name)
    for gpu in GPU_CATALOG:
        if wanted in (gpu.key, *gpu.aliases):
            return gpu
    names = ", ".join(gpu.key for gpu in GPU_CATALOG)
    raise LlmctlError(f"unknown GPU type {name!r}; choose one of: {names}")


@dataclass(frozen=True)
class LocalGpus:
    gpu: GpuType
    count: int


def detect_local_gpus() -> LocalGpus | None:
    """The GPUs of this machine, measured by torch; None without any (no torch import then)."""
    has_nvidia = os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None
    has_amd = os.path.exists("/dev/kfd")
    if not (has_nvidia or has_amd):
        return None
    try:
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return None
        props = torch.cuda.get_device_properties(0)
    except Exception:  # a broken driver is "no usable GPU" for planning purposes
        return None
    return LocalGpus(gpu=_match_local(props.name, int(props.total_memory), props), count=torch.cuda.device_count())


def _match_local(name: str, total_memory: int, props: object) -> GpuType:
    wanted = _normalize(name)
    for gpu in GPU_CATALOG:
        close = abs(gpu.memory_bytes - total_memory) < 0.05 * total_memory
        if close and (gpu.key.split("-")[0] in wanted):
            return GpuType(gpu.key, name, total_memory, gpu.interconnect, gpu.fp8, gpu.bf16)
    major = getattr(props, "major", 8)
    return GpuType(wanted or "local-gpu", name, total_memory, "unknown", fp8=major >= 9 or wanted.startswith("l"))
