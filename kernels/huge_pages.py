"""Large CPU buffers on 2 MiB pages (transparent huge pages), where Linux allows it.

Decoding reads the whole KV cache of every running sequence each step, block by block in
block-table order, and most Linux machines ship with THP in `madvise` mode, so torch's
buffers sit on 4 KiB pages: a page-table walk every 4 KiB of K/V read. A buffer
advised with MADV_HUGEPAGE before it is first touched gets 2 MiB pages instead
(benchmarks/cpu_attention.py and benchmarks/cpu_gemm.py measure both). Elsewhere (no Linux, THP
off, the advice refused) the buffer is an ordinary one: only speed differs.
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 * 1024**2
PAGE = 4096  # the smallest page: where huge pages are refused, each is faulted in on its own


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, populate: bool = True) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, in a fresh anonymous mapping advised onto huge pages,
    starting on a 2 MiB boundary. Up to 2 MiB of address space more than torch.zeros.

    populate: fault every page in now, so that a server's memory stays flat while it serves
    (tests/server/test_soak.py); leave it False for a buffer that is written whole right away."""
    nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    if nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):  # small, or not Linux
        return torch.zeros(shape, dtype=dtype)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)  # the tensor keeps it alive
    buffer = torch.frombuffer(mapping, dtype=torch.uint8)
    offset = (-buffer.data_ptr()) % HUGE_PAGE
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, offset, nbytes)
    except OSError:  # THP compiled out: ordinary pages, only speed differs
        pass
    region = buffer[offset:offset + nbytes]  # a fresh anonymous mapping reads as zeros
    if populate:
        _populate(region)
    return region.view(dtype).view(shape)


def _populate(region: torch.Tensor) -> None:
    """Fault every page of a uint8 region in: one byte written per 4 KiB page, spread over torch's
    threads. The kernel zeroes each page it faults in; zero_ over all of it costs a second pass."""
    pages = region[: region.numel() // PAGE * PAGE].view(-1, PAGE)
    pages[:, 0].zero_()
