"""Which adapters the engine knows (host memory) and which sit in its --max-loras slots.

Adapters are read and checked once, when registered (the server's --lora-modules and
/v1/load_lora_adapter, or the first request naming a new LoRARequest offline), and stay in
host memory. Before each step the adapters its sequences use are made resident: one
already in a slot stays, a new one takes a free slot or the least recently used slot that
this step does not need. The scheduler never runs more distinct adapters at once than
there are slots, so a step always finds room.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import torch

from llmctl.checkpoint.source import resolve_adapter
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.lora.adapter import LoRAAdapter, load_adapter
from llmctl.engine.lora.request import LoRARequest
from llmctl.engine.lora.slots import NO_ADAPTER, LoRASlots

if TYPE_CHECKING:
    from llmctl.engine.core.sequence import Sequence

logger = logging.getLogger("llmctl.engine")


class LoRAManager:
    def __init__(self, spec: ModelSpec, slots: dict[tuple[int, str], LoRASlots], max_loras: int, max_rank: int,
                 dtype: torch.dtype) -> None:
        self.spec, self.slots = spec, slots
        self.max_loras, self.max_rank, self.dtype = max_loras, max_rank, dtype
        self.registered: dict[int, LoRAAdapter] = {}  # lora_int_id -> adapter (host memory)
        self.resident: list[LoRAAdapter | None] = [None] * max_loras
        self._last_used = [0] * max_loras
        self._clock = 0
        self.num_slot_loads = 0  # adapters copied into a slot (swaps included)
        self._lock = threading.Lock()  # the server registers from its own thread

    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Read, check and register an adapter (AdapterError / ModelNotFoundError say what is wrong)."""
        if request.lora_int_id < 1:
            raise InvalidRequestError(f"lora_int_id must be at least 1 (got {request.lora_int_id})", "lora_request")
        source = resolve_adapter(request.lora_path)
        adapter = load_adapter(source.path, request.lora_name, self.spec, self.max_rank, self.dtype)
        with self._lock:
            self.registered[request.lora_int_id] = adapter
        logger.info("LoRA adapter %s (id %d) from %s: rank %d, %s, %.1f MiB", request.lora_name, request.lora_int_id,
                    source.name, adapter.rank, "/".join(adapter.targets), adapter.nbytes / 2**20)
        return adapter

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter; requests already running with it finish with it."""
        with self._lock:
            return self.registered.pop(lora_int_id, None) is not None

    def adapter_for(self, request: LoRARequest, load: bool = True) -> LoRAAdapter:
        """The registered adapter; an unknown one is read now (offline), or refused (load=False)."""
        with self._lock:
            adapter = self.registered.get(request.lora_int_id)
        if adapter is not None:
            return adapter
        if not load:  # the server registers adapters itself: this one was unloaded meanwhile
            raise InvalidRequestError(f"the LoRA adapter '{request.lora_name}' is not loaded", "model")
        return self.add(request)

    def activate(self, seqs: list[Sequence]) -> list[int]:
        """Make the step's adapters resident; the slot of each sequence (NO_ADAPTER for the base model)."""
        self._clock += 1
        needed = {seq.lora for seq in seqs if seq.lora is not None}
        slot_of = {adapter: self._slot_for(adapter, needed) for adapter in needed}
        return [slot_of[seq.lora] if seq.lora is not None else NO_ADAPTER for seq in seqs]

    def _slot_for(self, adapter: LoRAAdapter, needed: set[LoRAAdapter]) -> int:
        if adapter in self.resident:
            slot = self.resident.index(adapter)
            self._last_used[slot] = self._clock
            return slot
        free = [s for s, resident in enumerate(self.resident) if resident not in needed]
        if not free:  # the scheduler admits at most max_loras adapters at once
            raise RuntimeError(f"a step needs more than --max-loras {self.max_loras} adapters")
        slot = min(free, key=lambda s: (self.resident[s] is not None, self._last_used[s]))
        for (layer, module), linear in self.slots.items():
            linear.write(slot, adapter.weights.get((layer, module)))
        self.resident[slot] = adapter
        self._last_used[slot] = self._clock
        self.num_slot_loads += 1
        return slot
