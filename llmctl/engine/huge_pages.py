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
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+; Python 3.11 lacks the name


def zeros_on_huge_pages(shape: tuple[int, ...], dtype: torch.dtype, populate: bool = True) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, in a fresh anonymous mapping advised onto huge pages,
    starting on a 2 MiB boundary. Up to 2 MiB of address space more than torch.zeros.

    populate: fault every page in now, so that a server's memory stays flat while it serves
    (tests/test_soak.py); leave it False for a buffer that is written whole right away."""
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
    tensor = buffer[offset:offset + nbytes].view(dtype).view(shape)  # a fresh anonymous mapping reads as zeros
    if populate:
        _populate(mapping, tensor, offset, nbytes)
    return tensor


def _populate(mapping: mmap.mmap, tensor: torch.Tensor, offset: int, nbytes: int) -> None:
    """Fault the pages in. The kernel does it in one call (0.2 s for 2 GiB on huge pages here);
    writing zeros from Python's side took 2.4 s."""
    try:
        mapping.madvise(MADV_POPULATE_WRITE, offset, nbytes)
    except OSError:  # a kernel before 5.14
        tensor.zero_()
