"""The KV cache's CPU tier in one process (--kv-offloading-size; the driver's side: llmctl.engine.core.host_tier):
for each KV tensor of the device pool, a host tensor of the tier's blocks in the same layout (pinned memory
under a GPU, so copies run at full PCIe speed). A step's copies run before its own, in the order the driver
decided them. On a CPU the two pools are both host memory: the tier is a second, larger pool, and consecutive
stores (device -> host) or loads (host -> device) are one indexed copy each. On a GPU the copies run on a stream of
their own, so the host never waits for them and stores overlap the step's forward: evicted blocks are gathered on
the compute stream (the step may overwrite them at once), then sent to the tier on the copy stream; loads run on
the copy stream after them, and the compute stream waits for those only (its forward reads the loaded blocks)."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.core.step_messages import HostCopy
from llmctl.engine.layers.attention import KVCache
from llmctl.sizing.kv import stage_kv
from llmctl.units import GiB

logger = logging.getLogger("llmctl.engine")


@dataclass
class HostKVPool:
    pairs: list[tuple[torch.Tensor, torch.Tensor]]  # (device KV tensor, its host tier), one per distinct tensor
    num_blocks: int
    model_block_bytes: int  # one block of every layer, all ranks together (what a copy moves in all)
    stream: Any = None  # a GPU's copy stream (torch.cuda.Stream); None on a CPU

    def apply(self, copies: list[HostCopy]) -> None:
        runs = [(store, list(grouped)) for store, grouped in itertools.groupby(copies, key=lambda copy: copy.store)]
        if self.stream is None:
            self._copy_in_place(runs)
        else:
            self._copy_on_stream(runs)

    def _copy_in_place(self, runs: list[tuple[bool, list[HostCopy]]]) -> None:
        for store, run in runs:
            slots = torch.tensor([copy.slot for copy in run])
            for device_kv, host_kv in self.pairs:
                blocks = torch.tensor([copy.block for copy in run], device=device_kv.device)
                if store:
                    host_kv[slots] = device_kv[blocks].to("cpu")
                else:
                    device_kv[blocks] = host_kv[slots].to(device_kv.device)

    def _copy_on_stream(self, runs: list[tuple[bool, list[HostCopy]]]) -> None:
        """One asynchronous copy per block and tensor (host tier slots are contiguous, so no host-side gather)."""
        compute = torch.cuda.current_stream(self.pairs[0][0].device)
        loading = False
        for store, run in runs:
            if store:
                if loading:  # a block this step loaded may be stored again only once it is there
                    compute.wait_stream(self.stream)
                blocks = torch.tensor([copy.block for copy in run]).to(compute.device, non_blocking=True)
                gathered = [device_kv.index_select(0, blocks) for device_kv, _ in self.pairs]
            self.stream.wait_stream(compute)
            with torch.cuda.stream(self.stream):
                for index, (device_kv, host_kv) in enumerate(self.pairs):
                    if store:
                        gathered[index].record_stream(self.stream)  # kept until the copy stream has read it
                        for row, copy in enumerate(run):
                            host_kv[copy.slot].copy_(gathered[index][row], non_blocking=True)
                    else:
                        for copy in run:
                            device_kv[copy.block].copy_(host_kv[copy.slot], non_blocking=True)
            loading = loading or not store
        if loading:
            compute.wait_stream(self.stream)

    @property
    def nbytes(self) -> int:
        return sum(host.numel() * host.element_size() for _, host in self.pairs)


def host_kv_pool(offloading_gib: float, spec: ModelSpec, caches: dict[int, KVCache], block_size: int,
                 device: torch.device) -> HostKVPool:
    """As many tier blocks as `offloading_gib` holds of the whole model's blocks (vLLM's size: all ranks
    together), each rank keeping its own layers' and heads' share of them."""
    tensors = list({cache.kv.data_ptr(): cache.kv for cache in caches.values()}.values())
    element = tensors[0].element_size() if tensors else 1
    model_block_bytes = stage_kv(spec, 1, range(spec.num_layers), element, block_size).block_bytes
    num_blocks = int(offloading_gib * GiB) // model_block_bytes if model_block_bytes else 0
    pin = device.type == "cuda"
    pairs = [(kv, torch.empty((num_blocks, *kv.shape[1:]), dtype=kv.dtype, pin_memory=pin)) for kv in tensors]
    pool = HostKVPool(pairs, num_blocks, model_block_bytes, torch.cuda.Stream(device) if pin else None)
    logger.info("KV cache CPU tier: %d blocks (%.2f GiB in this process)", num_blocks, pool.nbytes / GiB)
    return pool
