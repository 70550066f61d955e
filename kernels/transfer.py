"""Host-to-device copies of a step's metadata: one pinned, non-blocking copy per tensor on
CUDA (the GPU does not wait for a pageable staging copy); a no-op on CPUs."""

from __future__ import annotations

import torch


def to_device(values: list[int] | list[list[int]] | torch.Tensor, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    host = values.to(dtype) if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
