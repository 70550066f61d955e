"""The GPU KV budget (vLLM's: utilization × total − weights − activation peak − non-torch memory), with the
numbers CUDA would report given as data, so it is checked here without a GPU."""

from __future__ import annotations

import torch

from llmctl.engine.worker.kv_cache import DeviceMemory, gpu_kv_bytes

GiB = 1 << 30


def test_one_engine_gets_vllms_budget():
    # 80 GiB GPU, 16 GiB of weights loaded, 0.5 GiB CUDA context outside torch's allocator
    memory = DeviceMemory(free=63 * GiB + GiB // 2, total=80 * GiB, reserved=16 * GiB, allocated=16 * GiB)
    kv = gpu_kv_bytes(memory, 0.9, resident_bytes=16 * GiB, activation_bytes=2 * GiB, step_tokens=8192)
    assert kv == int(0.9 * 80 * GiB) - 16 * GiB - 2 * GiB - GiB // 2  # 53.5 GiB


def test_a_second_engine_in_the_process_is_not_this_engines_weights():
    # a first engine holds 16 GiB of weights + 40 GiB of KV; the second has just loaded 1 GiB of weights
    held = 16 * GiB + 40 * GiB + GiB
    memory = DeviceMemory(free=80 * GiB - GiB // 2 - held, total=80 * GiB, reserved=held, allocated=held)
    kv = gpu_kv_bytes(memory, 0.9, resident_bytes=GiB, activation_bytes=GiB, step_tokens=2048)
    # vLLM's formula alone would give 0.9 × 80 − 1 − 1 − 0.5 = 69.5 GiB, more than is free: capped at what
    # can still be allocated beside the activation peak and 256 MiB of headroom (22.5 − 1 − 0.25 GiB; without it
    # the last layer's tensor of a capped pool did not fit on an H100), where counting every tensor in the process
    # as weights (memory_allocated) left the second engine nothing
    assert kv == memory.free - GiB - GiB // 4 == 21 * GiB + GiB // 4


def test_memory_cached_by_torchs_allocator_counts_as_free():
    # a finished engine's pool sits in the caching allocator (reserved, not allocated): it can be reused
    memory = DeviceMemory(free=10 * GiB, total=80 * GiB, reserved=70 * GiB - GiB // 2, allocated=GiB)
    kv = gpu_kv_bytes(memory, 0.9, resident_bytes=GiB, activation_bytes=GiB, step_tokens=2048)
    assert kv == int(0.9 * 80 * GiB) - GiB - GiB - GiB // 2


def test_each_rank_makes_its_own_gpu_current(monkeypatch):
    """Triton launches on the current CUDA device: rank 1 of a TP group on cuda:1 must make cuda:1 current,
    or its kernels run on GPU 0 with GPU 1's pointers. Checked at the call CUDA would receive."""
    from llmctl.engine.distributed.group import Rank
    from llmctl.engine.worker.loader import bind_device, device_for

    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    device = device_for("auto", Rank(rank=1, tp=2))
    bind_device(device)
    bind_device(torch.device("cpu"))  # CPUs have no current device
    bind_device(torch.device("cuda"))  # no index: the current device (torch refuses set_device without one)
    assert made_current == [torch.device("cuda", 1)]
