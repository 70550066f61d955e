"""The C++ kernels split their work over torch's threads (at::parallel_for): their tests run on two threads,
so the splitting is tested, though the suite's workers run on one (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def two_torch_threads() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
