"""What a multimodal prompt becomes before it reaches the engine: token ids with each image's placeholder
positions, the processor's tensors for that image, and a hash of them."""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field

import torch

from llmctl.engine.multimodal.mrope import MRopePositions


@dataclass(eq=False)  # identity: tensors have no truth value to compare
class MultimodalItem:
    """One image: the tensors its encoder takes, and the prompt positions its embeddings fill, in order."""

    modality: str
    content_hash: str  # of the processed tensors: the same image at the same settings hashes the same
    data: dict[str, torch.Tensor]
    positions: list[int]  # the placeholder tokens' positions; encoder output row i fills positions[i]
    both_ways: bool = False  # its tokens attend to each other in both directions (Gemma 3): one run, never split

    @property
    def span(self) -> tuple[int, int]:
        """The first and last placeholder positions."""
        return self.positions[0], self.positions[-1]

    @property
    def num_embeddings(self) -> int:
        return len(self.positions)

    def overlaps(self, start: int, end: int) -> bool:
        """Whether a placeholder of this item lies in [start, end) (positions ascend: a binary search)."""
        at = bisect.bisect_left(self.positions, start)
        return at < len(self.positions) and self.positions[at] < end

    def rows_within(self, start: int, end: int) -> tuple[list[int], list[int]]:
        """(positions, output rows) of this item that fall in [start, end)."""
        first, last = bisect.bisect_left(self.positions, start), bisect.bisect_left(self.positions, end)
        return self.positions[first:last], list(range(first, last))


@dataclass
class ProcessedPrompt:
    """A prompt the multimodal processor has expanded: what the engine takes instead of text."""

    prompt: str | None
    token_ids: list[int]
    items: list[MultimodalItem] = field(default_factory=list)
    mrope: MRopePositions | None = None  # M-RoPE models: every prompt token's (t, h, w) position


def content_hash(modality: str, data: dict[str, torch.Tensor]) -> str:
    """blake2b over the item's tensors (names, dtypes, shapes and bytes)."""
    digest = hashlib.blake2b(modality.encode(), digest_size=16)
    for name in sorted(data):
        tensor = data[name].detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def block_keys(items: list[MultimodalItem], start: int, end: int) -> tuple[str, ...]:
    """The hashes of the images whose placeholders fall in [start, end): part of that KV block's identity,
    so the same placeholder tokens with another image never share cached blocks."""
    return tuple(item.content_hash for item in items if item.overlaps(start, end))


EnginePrompt = str | list[int] | ProcessedPrompt  # what the engine's add_request and generate take
