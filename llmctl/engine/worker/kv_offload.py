"""The KV cache's CPU tier in one process (--kv-offloading-size; the driver's side: llmctl.engine.core.host_tier):
for each KV tensor of the device pool, a host tensor of the tier's blocks in the same layout (pinned memory
under a GPU, so copies run at full PCIe speed). A step's copies run before its own, in the order the driver
decided them: consecutive stores (device -> host) and loads (host -> device) as one indexed copy each.
On a CPU the two pools are both host memory: the tier is a second, larger pool, and a copy is a memcpy."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

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

    def apply(self, copies: list[HostCopy]) -> None:
        for store, grouped in itertools.groupby(copies, key=lambda copy: copy.store):
            run = list(grouped)
            slots = torch.tensor([copy.slot for copy in run])
            for device_kv, host_kv in self.pairs:
                blocks = torch.tensor([copy.block for copy in run], device=device_kv.device)
                if store:
                    host_kv[slots] = device_kv[blocks].to("cpu")
                else:
                    device_kv[blocks] = host_kv[slots].to(device_kv.device, non_blocking=True)

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
    pool = HostKVPool(pairs, num_blocks, model_block_bytes)
    logger.info("KV cache CPU tier: %d blocks (%.2f GiB in this process)", num_blocks, pool.nbytes / GiB)
    return pool
