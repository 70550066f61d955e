"""llmctl's kernels as registered torch ops (`torch.ops.llmctl.*`): one home for how they are declared.

A registered op has a fake implementation beside the real one, so a trace over fake CUDA tensors runs through
it on a machine without a GPU (the launch-count and host-synchronization tests, tests/engine/layers/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Declared with torch.library.Library (about 4 µs a call here) rather than torch.library.custom_op, whose
# autograd wrapper cost 14-18 µs a call on this CPU: a 32-layer model makes ~100 such calls a step.
_LIBRARY = torch.library.Library("llmctl", "FRAGMENT")


def define(schema: str, implementation: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """One `llmctl::` op: its schema, its implementation on CUDA tensors (and CPU ones, which Triton's
    interpreter runs in the tests), and its fake implementation for traces."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema)
    for device in ("CUDA", "CPU"):
        _LIBRARY.impl(name, implementation, device)
    torch.library.register_fake(f"llmctl::{name}")(fake)
