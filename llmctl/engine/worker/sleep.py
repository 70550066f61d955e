"""Sleep mode (vLLM's --enable-sleep-mode): a process that keeps its engine but gives its memory back between uses.

- level 1: the KV cache (and the recurrent layers' states) discarded; the weights kept in CPU memory — moved there
  from a GPU, where CPUs already hold them.
- level 2: the weights discarded too, read again from the checkpoint on waking.

What "discarded" frees: on CPUs each tensor's whole pages are handed back to the OS (madvise DONTNEED) — the
addresses stay valid, so every holder of a tensor (layers, backends, the graphs' buffers) keeps working, and a page
touched again comes back as zeros; on GPUs the tensor's storage is swapped for an empty one and made again on waking
(CUDA graphs, which hold addresses, are captured again by the caller). Level 2 reads the checkpoint into the same
layers and packs their CPU copies again: unquantized checkpoints only (quantized and GGUF layers derive more than a
copy at load, so they sleep at level 1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from llmctl.engine.errors import InvalidRequestError, SleepConflictError
from llmctl.engine.worker.heap import release_pages
from llmctl.engine.worker.loaded_model import LoadedModel

logger = logging.getLogger("llmctl.engine")

SLEEP_LEVELS = (1, 2)
WAKE_TAGS = ("weights", "kv_cache")


def _distinct(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """One tensor per storage (tied embeddings, views of one arena); emptied GPU tensors each by themselves."""
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(tensor.untyped_storage().data_ptr() if tensor.numel() else id(tensor), tensor)
    return list(seen.values())


def kv_tensors(loaded: LoadedModel) -> list[torch.Tensor]:
    """The KV cache's pages and the recurrent layers' states."""
    tensors = [cache.kv for cache in loaded.kv_caches.values()]
    if loaded.states is not None:
        tensors += [t for layer in loaded.states.layers.values() for t in (layer.conv, layer.ssm)]
    return _distinct(tensors)


def weight_tensors(loaded: LoadedModel) -> list[torch.Tensor]:
    """The checkpoint's weights (the model's parameters) and their packed CPU copies in llmctl's panels."""
    from llmctl.engine.layers.cpu_gemm import packed_weights

    packed = [pair[1].data for pair in packed_weights(loaded.model) if pair[1].panels]
    return _distinct([*loaded.model.parameters(), *packed])


@dataclass
class SleepState:
    """What a sleeping process gave up, and how to get it back."""

    level: int = 0  # 0: awake
    asleep: set[str] = field(default_factory=set)  # of WAKE_TAGS
    shapes: dict[int, tuple[torch.Size, torch.dtype]] = field(default_factory=dict)  # GPU storages made again

    def release(self, tensors: list[torch.Tensor]) -> int:
        """Discard the tensors' contents and give their memory back; returns the bytes given back."""
        freed = 0
        for tensor in tensors:
            if tensor.device.type == "cpu":
                freed += release_pages(tensor)
            else:
                self.shapes[id(tensor)] = (tensor.shape, tensor.dtype)
                freed += tensor.untyped_storage().nbytes()
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        if any(t.is_cuda for t in tensors):
            torch.cuda.empty_cache()
        return freed

    def restore(self, tensors: list[torch.Tensor]) -> None:
        """Storage again for released GPU tensors (zeros; CPU pages come back by themselves)."""
        for tensor in tensors:
            if id(tensor) in self.shapes:
                shape, dtype = self.shapes.pop(id(tensor))
                tensor.data = torch.zeros(shape, dtype=dtype, device=tensor.device)


def offload(tensors: list[torch.Tensor], device: torch.device) -> None:
    """Level 1's weights: from a GPU into CPU memory, or back (to `device`); nothing to move on CPUs."""
    for tensor in tensors:
        if tensor.device != device:
            tensor.data = tensor.data.to(device)


def check_level_two(loaded: LoadedModel) -> None:
    """Level 2 reads the checkpoint again into the layers: only where they hold plain copies of it."""
    if loaded.spec.quantization is not None or loaded.source.gguf_path is not None:
        raise SleepConflictError("sleep level 2 reads the weights again from an unquantized checkpoint only (a "
                                 "quantized or GGUF model derives more than a copy at load): use level 1")
    if loaded.lora_slots:
        raise SleepConflictError("sleep level 2 would lose the LoRA adapters' slots (they are not in the "
                                 "checkpoint): use level 1")


class Sleeper:
    """One process's sleep mode: `read_weights` reads the checkpoint into the layers again (level 2's waking),
    `after_waking` makes what held the old addresses again (CUDA graphs)."""

    def __init__(self, loaded: LoadedModel, read_weights: Callable[[], None],
                 after_waking: Callable[[], None]) -> None:
        self.loaded, self.read_weights, self.after_waking = loaded, read_weights, after_waking
        self.state = SleepState()

    @property
    def is_sleeping(self) -> bool:
        return bool(self.state.asleep)

    def sleep(self, level: int) -> int:
        """Give the memory of `level` back; returns the bytes given back."""
        if level not in SLEEP_LEVELS:
            raise InvalidRequestError(f"sleep level {level}: use 1 (the KV cache) or 2 (the weights too)", "level")
        if self.is_sleeping:
            raise SleepConflictError(f"asleep already (level {self.state.level}): wake it up first")
        if level == 2:
            check_level_two(self.loaded)
        freed = self.state.release(kv_tensors(self.loaded))
        weights = weight_tensors(self.loaded)
        if level == 1:
            freed += sum(t.untyped_storage().nbytes() for t in weights if t.is_cuda)
            offload(weights, torch.device("cpu"))
            if self.loaded.device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            freed += self.state.release(weights)
        self.state.level, self.state.asleep = level, set(WAKE_TAGS)
        logger.info("asleep at level %d: %.2f GiB given back", level, freed / 2**30)
        return freed

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Make what `tags` name (default: all) again; awake when nothing is left asleep."""
        unknown = sorted(set(tags or ()) - set(WAKE_TAGS))
        if unknown:
            raise InvalidRequestError(f"wake_up tags {unknown}: use {' and '.join(WAKE_TAGS)}", "tags")
        waking = self.state.asleep & set(tags or WAKE_TAGS)
        if "weights" in waking:
            weights = weight_tensors(self.loaded)
            if self.state.level == 1:
                offload(weights, self.loaded.device)
            else:
                self.state.restore(weights)
                self.read_weights()
        if "kv_cache" in waking:
            self.state.restore(kv_tensors(self.loaded))
        self.state.asleep -= waking
        if waking and not self.state.asleep:
            self.state.level = 0
            self.after_waking()
            logger.info("awake")
