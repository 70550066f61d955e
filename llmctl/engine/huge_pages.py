"""Large CPU buffers on 2 MiB pages (transparent huge pages), where Linux allows it.

Decoding reads the whole KV cache of every running sequence each step, block by block in
block-table order, and most Linux machines ship with THP in `madvise` mode, so torch's
buffers sit on 4 KiB pages: a page-table walk every 4 KiB of K/V read. A buffer
advised with MADV_HUGEPAGE before it is first touched gets 2 MiB pages instead
(benchmarks/cpu_attention.py and benchmarks/cpu_gemm.py measure both). Elsewhere (no Linux, THP
off, the advice refused) the buffer is an ordinary one: only speed differs.
"""

from __future__ import annotations

import ctypes
import math
import sys

import torch

HUGE_PAGE = 2 * 1024**2
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux


def _advise_huge_pages(address: int, length: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, starting on a 2 MiB boundary and advised onto huge
    pages before the zeros touch it. Costs up to 2 MiB of address space more than torch.zeros."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if nbytes < HUGE_PAGE:
        return torch.zeros(shape, dtype=dtype)
    buffer = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # untouched: no page is mapped yet
    region = buffer[(-buffer.data_ptr()) % HUGE_PAGE:][:nbytes]
    _advise_huge_pages(region.data_ptr(), nbytes)
    return region.view(dtype).view(shape).zero_()
