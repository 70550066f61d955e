"""Which GPUs to plan for: the flags, else this machine's GPUs, else a documented default."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import LlmctlError
from llmctl.plan.gpus import DEFAULT_GPU_KEY, GpuType, detect_local_gpus, lookup_gpu


@dataclass(frozen=True)
class Hardware:
    gpu: GpuType
    gpus: int
    note: str | None  # said to the user when something was assumed


def resolve_hardware(gpu: str | None, gpus: int | None, nodes: int = 1, gpus_per_node: int | None = None) -> Hardware:
    if nodes < 1:
        raise LlmctlError("--nodes must be at least 1")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise LlmctlError("--gpus-per-node must be at least 1")
    if gpus is not None and gpus_per_node is not None and gpus != nodes * gpus_per_node:
        raise LlmctlError(f"--gpus {gpus} disagrees with --nodes {nodes} × --gpus-per-node {gpus_per_node}; "
                          "pass one or the other")
    local = detect_local_gpus() if (gpu is None or gpus is None) else None
    note = None
    if gpu is not None:
        chosen = lookup_gpu(gpu)
    elif local is not None:
        chosen = local.gpu
        note = f"planning for this machine's {local.count} × {local.gpu.name}"
    else:
        chosen = lookup_gpu(DEFAULT_GPU_KEY)
        note = f"no GPU detected: planning for {chosen.name} (pass --gpu to choose)"
    if gpus is None:
        if gpus_per_node is not None:
            gpus = nodes * gpus_per_node
        elif local is not None and gpu is None:
            gpus = local.count * nodes
        else:
            gpus = nodes
    return Hardware(gpu=chosen, gpus=gpus, note=note)
