"""Copies between host and device. To the device: a step's metadata, one pinned, non-blocking copy per tensor on
CUDA (the GPU does not wait for a pageable staging copy); a no-op on CPUs. To the host: a step's results in one
copy, so the host waits for the device once per step."""

from __future__ import annotations

import torch


def to_device(values: list[int] | list[list[int]] | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def to_host(parts: list[torch.Tensor]) -> list[list]:
    """Tensors (any device, any shape) as flat Python lists, in one device-to-host copy: several are flattened into
    one float64 tensor first, which holds int64 ids below 2^53 and float32 values exactly."""
    if len(parts) == 1:
        return [parts[0].reshape(-1).cpu().tolist()]
    flat = torch.cat([part.reshape(-1).to(torch.float64) for part in parts]).cpu().tolist()
    lists, start = [], 0
    for part in parts:
        lists.append(flat[start:start + part.numel()])
        start += part.numel()
    return lists
