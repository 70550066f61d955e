"""One step at a time: running sequences first, then waiting ones, under a token budget.

Every sequence advances by `num_tokens - num_computed_tokens` (1 for a decode, a chunk of
the prompt for a prefill), so prefills and decodes share a step and a long prompt is
split over steps. When blocks run out the newest running sequence is preempted: its
blocks are freed, it goes back to the front of the queue and is recomputed later with
the tokens it has generated so far.

With pipeline parallelism the sequences are split into lanes, one per batch in flight
(vLLM's virtual engines): a lane is scheduled only when its previous batch has come back,
so a sequence is never in two batches at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.sequence import Sequence, SequenceStatus
from llmctl.engine.spec_decode.proposal import Draft


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # including the proposed tokens, when there is a draft
    draft: Draft | None = None  # speculative decoding: proposed tokens verified in this step

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft.token_ids) if self.draft is not None else 0

    @property
    def samples(self) -> bool:
        """The step reaches the end of the sequence's tokens, so it yields a next token."""
        return self.seq.num_computed_tokens + self.num_new_tokens - self.num_draft_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass
class Scheduler:
    block_manager: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0  # 0: a prefill may use the whole remaining budget
    max_loras: int = 0  # --max-loras: distinct adapters running at once (0: LoRA is off)
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, lane: int = 0) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        budget = self._schedule_running(out, budget, lane)
        if not out.preempted:  # no new admissions while memory is short
            self._schedule_waiting(out, budget, lane)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, lane: int) -> int:
        index = 0
        running = [seq for seq in self.running if seq.lane == lane]
        while index < len(running) and budget > 0:
            seq = running[index]
            self.block_manager.release_slid_out(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new <= 0:
                index += 1
                continue
            while not self.block_manager.can_allocate(seq, num_new):
                victim = running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break  # the sequence preempted itself: it was the newest
            draft = self._take_draft(seq, num_new, budget)
            num_new += len(draft.token_ids) if draft is not None else 0
            out.block_copies += self.block_manager.allocate(seq, num_new)
            out.scheduled.append(ScheduledSeq(seq, num_new, draft))
            budget -= num_new
            index += 1
        return budget

    def _take_draft(self, seq: Sequence, num_new: int, budget: int) -> Draft | None:
        """The sequence's proposal, cut to the budget and the free blocks; never at a preemption's cost."""
        draft, seq.draft = seq.draft, None
        if draft is None or num_new != seq.num_tokens - seq.num_computed_tokens:
            return None
        k = min(len(draft.token_ids), budget - num_new)
        while k > 0 and not self.block_manager.can_allocate(seq, num_new + k):
            k -= 1
        return draft.truncated(k) if k > 0 else None

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, lane: int) -> None:
        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = next((s for s in self.waiting if s.lane == lane and self._adapter_fits(s)), None)
            if seq is None:
                break
            self.block_manager.match_prefix(seq)
            self.block_manager.release_slid_out(seq)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if self.long_prefill_token_threshold:
                num_new = min(num_new, self.long_prefill_token_threshold)
            if not self.block_manager.can_allocate(seq, num_new):
                if not self.running and not out.scheduled:
                    # Alone it does not fit a whole prompt: take what fits, chunked.
                    num_new = min(num_new, self._tokens_that_fit(seq))
                    if num_new <= 0:
                        break
                else:
                    break
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.block_copies += self.block_manager.allocate(seq, num_new)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new

    def _adapter_fits(self, seq: Sequence) -> bool:
        """A sequence whose adapter would exceed --max-loras running adapters waits (others go ahead)."""
        if seq.lora is None:
            return True
        running = {s.lora for s in self.running if s.lora is not None}
        return seq.lora in running or len(running) < self.max_loras

    def _tokens_that_fit(self, seq: Sequence) -> int:
        size = self.block_manager.block_size
        room = len(seq.block_table) * size - seq.num_computed_tokens
        return room + self.block_manager.num_free_blocks * size

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        for scheduled in [s for s in out.scheduled if s.seq is seq]:
            out.scheduled.remove(scheduled)
        self.block_manager.free(seq)
        seq.draft = None
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks at once."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
