"""The scheduler's side of image encoders (vLLM's encoder budget and encoder cache manager): which images
a step encodes, within a per-step budget of encoder output tokens, and which outputs the workers keep.

An image is encoded once, in the step that first reaches its placeholders, and its output stays in the
workers' encoder cache while any live sequence of its prompt may need it — so a prompt chunked over several
steps, or preempted and recomputed, takes its embeddings from the cache instead of encoding again."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmctl.engine.core.sequence import Sequence
from llmctl.engine.multimodal.items import MultimodalItem


@dataclass
class EncoderWork:
    """What a step asks the workers' encoder cache to do."""

    encode: list[MultimodalItem] = field(default_factory=list)
    free: list[str] = field(default_factory=list)  # content hashes no live sequence needs any more


def whole_images(items: list[MultimodalItem], start: int, num_new: int) -> int:
    """The chunk [start, start + num_new) never ends inside an image whose tokens attend both ways: it stops
    before one that starts later, and takes one it starts in (or resumes from a cached prefix) whole, past
    the step's token budget if it must (vLLM's disable_chunked_mm_input)."""
    end = start + num_new
    for item in items:
        first, last = item.span
        if item.both_ways and first < end <= last:
            return first - start if first > start else last + 1 - start
    return num_new


@dataclass
class EncoderScheduler:
    budget: int  # encoder output tokens per step (vLLM's max_num_encoder_input_tokens)
    users: dict[str, set[int]] = field(default_factory=dict)  # content hash -> sequences relying on its output
    pending_free: list[str] = field(default_factory=list)

    def fit(self, seq: Sequence, num_new: int, work: EncoderWork) -> tuple[int, list[MultimodalItem]]:
        """The tokens of `seq` this step can compute and the images it must encode for them: the chunk stops
        before the first image that would overrun the budget (one image larger than the whole budget is
        encoded alone), so an image is never half-encoded."""
        start, new = seq.num_computed_tokens, list[MultimodalItem]()
        num_new = whole_images(seq.mm_items, start, num_new)
        spent = sum(item.num_embeddings for item in work.encode)
        for item in seq.mm_items:
            if not item.overlaps(start, start + num_new):
                continue
            if item.content_hash in self.users or any(item.content_hash == other.content_hash for other in new):
                continue
            if spent > 0 and spent + item.num_embeddings > self.budget:
                return max(0, min(num_new, item.positions[0] - start)), new
            spent += item.num_embeddings
            new.append(item)
        return num_new, new

    def commit(self, seq: Sequence, start: int, num_new: int, work: EncoderWork,
               new: list[MultimodalItem]) -> None:
        """The chunk was scheduled: its new images are encoded this step, and `seq` holds every image it used."""
        used = [item for item in seq.mm_items if item.overlaps(start, start + num_new)]
        work.encode += [item for item in new if item in used]  # a chunk cut shorter after fit() skips the rest
        for item in used:
            self.users.setdefault(item.content_hash, set()).add(seq.seq_id)

    def release(self, seq: Sequence) -> None:
        """A finished sequence needs its images no more; outputs nobody needs are freed at the next step."""
        for item in seq.mm_items:
            holders = self.users.get(item.content_hash)
            if holders is not None and seq.seq_id in holders:
                holders.discard(seq.seq_id)
                if not holders:
                    del self.users[item.content_hash]
                    self.pending_free.append(item.content_hash)

    def take_frees(self, work: EncoderWork) -> None:
        work.free += [h for h in self.pending_free if h not in self.users]
        self.pending_free = []
