"""The C library's heap on CPUs: freed step tensors kept for the next step, loading's garbage given back once.

glibc returns large freed blocks to the OS, so every big step tensor is page-faulted in again; keeping them in
the heap makes CPU steps markedly faster (vLLM recommends tcmalloc for the same reason). Loading frees much more
than a step ever reuses (tensors read then copied, parts stacked into fused weights, dtype conversions), so while
it runs every large block is its own mapping, handed back the moment it is freed (kept in the heap, that garbage
raised the default model's peak by 60 MiB), and the heap's free memory is handed back once when it ends. Best
effort: other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MADV_DONTNEED = 4


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name or "libc" not in name:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def keep_freed_memory_in_heap() -> None:
    """Serve allocations up to 1 GiB from the heap and do not hand freed heap back eagerly (serving)."""
    _thresholds(mmap_bytes=1 << 30, trim_bytes=1 << 31)


def hand_freed_memory_back() -> None:
    """Map every allocation of 128 KiB or more on its own and trim the heap eagerly (loading)."""
    _thresholds(mmap_bytes=128 << 10, trim_bytes=128 << 10)


def _thresholds(mmap_bytes: int, trim_bytes: int) -> None:
    libc = _glibc()
    try:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes)
            libc.mallopt(M_TRIM_THRESHOLD, trim_bytes)
    except AttributeError:
        pass


def release_loading_garbage() -> None:
    """Return the heap's free memory to the OS once (malloc_trim; a few ms)."""
    libc = _glibc()
    try:
        if libc is not None:
            libc.malloc_trim(0)
    except AttributeError:
        pass


def release_pages(tensor: torch.Tensor) -> int:
    """Hand a CPU tensor storage's whole pages back to the OS (madvise DONTNEED: the addresses stay valid, a page
    touched again is zeros; sleep mode, llmctl.engine.worker.sleep); returns the bytes released."""
    storage = tensor.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (start + size) // mmap.PAGESIZE * mmap.PAGESIZE
    libc = _glibc()
    if last <= first or libc is None:
        return 0
    if libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_DONTNEED) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) failed")
    return last - first
