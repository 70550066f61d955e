"""One step at a time: running sequences first, then waiting ones, under a token budget.

Every sequence advances by `num_tokens - num_computed_tokens` (1 for a decode, a chunk of
the prompt for a prefill), so prefills and decodes share a step and a long prompt is
split over steps. When blocks run out the newest running sequence is preempted: its
blocks are freed, it goes back to the front of the queue and is recomputed later with
the tokens it has generated so far.

With pipeline parallelism the sequences are split into lanes, one per batch in flight
(vLLM's virtual engines): a lane is scheduled only when its previous batch has come back,
so a sequence is never in two batches at once.

After each step `update_from_output` takes the step's sampled tokens: it advances what was
computed, registers full blocks for prefix caching, adds the siblings of n > 1 requests,
appends tokens with their stop checks (EOS, stop ids, stop strings, max_tokens,
max_model_len), gives back the blocks of rejected proposals and frees what finished.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from llmctl.engine.core.block_manager import BlockManager, PrefixCacheStats
from llmctl.engine.core.sequence import Sequence, SequenceStatus, TokenLogprob
from llmctl.engine.core.step_messages import HostCopy
from llmctl.engine.multimodal.encoder_budget import EncoderScheduler, EncoderWork
from llmctl.engine.multimodal.items import MultimodalItem
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
        """The step reaches the end of the sequence's tokens, so it yields a next token (read before the step is
        counted as computed)."""
        seq = self.seq
        return seq.num_computed_tokens + self.num_new_tokens - self.num_draft_tokens == \
            seq.num_tokens + seq.num_placeholders


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    host_copies: list[HostCopy] = field(default_factory=list)  # the KV cache's CPU tier (core.host_tier)
    preempted: list[Sequence] = field(default_factory=list)
    advanced: bool = False  # async scheduling: counted as computed when submitted, not when its tokens come back
    encoder: EncoderWork = field(default_factory=EncoderWork)  # images to encode, encoder outputs to free
    submitted_at: float = 0.0  # time.perf_counter() when it went to the executor

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass
class SampledSeq:
    """What one step produced for a sequence: one sampled token, or (speculative decoding) the
    accepted proposals followed by the token after them. Forked siblings name their parent."""

    seq: Sequence
    tokens: list[tuple[int, TokenLogprob | None]]
    verified: bool = False  # tokens[:-1] are accepted proposals whose K/V this step wrote
    forked_from: Sequence | None = None  # n > 1: a new sibling that shares the parent's blocks


class TokenText(Protocol):
    """The output processor's side of a new token: detokenize it and, when asked, say which stop
    string the text now ends with (cutting the text there)."""

    def add_token(self, seq: Sequence, search_stop_strings: bool) -> str | None: ...


@dataclass
class TokenCounts:
    prompt_tokens: int = 0  # of requests that produced their first token
    generation_tokens: int = 0


@dataclass
class Scheduler:
    block_manager: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0  # 0: a prefill may use the whole remaining budget
    max_loras: int = 0  # --max-loras: distinct adapters running at once (0: LoRA is off)
    eos_token_ids: list[int] = field(default_factory=list)
    max_model_len: int = 1 << 62  # the engine's context limit; no limit beyond max_tokens by default
    rope_switch_length: int | None = None  # LongRoPE's pretraining length (see _passes_rope_switch)
    scheduling_policy: str = "fcfs"  # "priority": lower SamplingParams.priority first, then arrival (vLLM's)
    encoder: EncoderScheduler | None = None  # vision-language models: the per-step image encoder budget
    pool_whole_prompts: bool = False  # a pooler that reads every prompt row: pooling prompts run whole, uncached
    chunked_prefill: bool = True  # False (vLLM's --no-enable-chunked-prefill): a prompt's uncached rest in one step
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    counts: TokenCounts = field(default_factory=TokenCounts)

    def add(self, seq: Sequence) -> None:
        if self.scheduling_policy == "priority":
            self._queue_by_priority(seq)
        else:
            self.waiting.append(seq)

    def _queue_by_priority(self, seq: Sequence) -> None:
        at = next((i for i, other in enumerate(self.waiting) if _rank(other) > _rank(seq)), len(self.waiting))
        self.waiting.insert(at, seq)

    def _victim(self, running: list[Sequence]) -> int:
        """Where in running the sequence to preempt is: the newest (fcfs), or the least urgent (priority)."""
        if self.scheduling_policy == "priority":
            return max(range(len(running)), key=lambda i: _rank(running[i]))
        return len(running) - 1

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def reset_stats(self) -> None:
        """Forget the warm-up: its cached prefix, counters and preemptions."""
        self.block_manager.reset_prefix_cache()
        self.block_manager.stats = PrefixCacheStats()
        self.num_preemptions = 0
        self.counts = TokenCounts()

    def lane_loads(self, lanes: int) -> list[int]:
        """Sequences per pipeline lane, running or waiting."""
        load = [0] * lanes
        for seq in [*self.running, *self.waiting]:
            load[seq.lane] += 1
        return load

    def is_stuck(self) -> bool:
        """Nothing could be scheduled although requests wait and none runs: the first waiting
        sequence needs more blocks than the cache has."""
        return bool(self.waiting) and not self.running

    def schedule(self, lane: int = 0, ahead: bool = False) -> SchedulerOutput:
        """`ahead` (async scheduling): the next step while one is still running, whose sampled tokens are
        placeholders here; such a step never preempts (the step in flight uses the blocks) and admits no one
        when a running sequence is short of blocks — the engine then waits and schedules with the tokens."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        budget, short = self._schedule_running(out, budget, lane, ahead)
        if not out.preempted and not short:  # no new admissions while memory is short
            self._schedule_waiting(out, budget, lane)
        if self.encoder is not None:
            self.encoder.take_frees(out.encoder)
        if self.block_manager.host is not None and out.scheduled:  # an empty step is not submitted: they wait
            out.host_copies = self.block_manager.host.take_copies()
        return out

    def _fit_encoder(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> tuple[int, list[MultimodalItem]]:
        """The prompt chunk cut before an image the step's encoder budget cannot take (llmctl.engine.multimodal)."""
        if self.encoder is None or not seq.mm_items or not seq.in_prefill:
            return num_new, []
        return self.encoder.fit(seq, num_new, out.encoder)

    def _schedule(self, out: SchedulerOutput, seq: Sequence, num_new: int, images: list[MultimodalItem],
                  draft: Draft | None = None) -> None:
        if self.encoder is not None and seq.mm_items:
            self.encoder.commit(seq, seq.num_computed_tokens, num_new, out.encoder, images)
        out.block_copies += self.block_manager.allocate(seq, num_new)
        out.scheduled.append(ScheduledSeq(seq, num_new, draft))

    def _schedule_running(self, out: SchedulerOutput, budget: int, lane: int, ahead: bool) -> tuple[int, bool]:
        index = 0
        running = [seq for seq in self.running if seq.lane == lane]
        while index < len(running) and budget > 0:
            seq = running[index]
            if seq.num_placeholders and self._ends_with_pending_token(seq):
                index += 1  # its last token is being sampled: nothing follows it
                continue
            if self._passes_rope_switch(seq):
                self.block_manager.free(seq)  # computed again from the first token, below
                seq.rope_recomputed = True
            self.block_manager.release_slid_out(seq)
            num_new = min(seq.num_tokens + seq.num_placeholders - seq.num_computed_tokens, budget)
            num_new, images = self._fit_encoder(seq, num_new, out)
            if num_new <= 0:
                index += 1
                continue
            if ahead and not self.block_manager.can_allocate(seq, num_new):
                return budget, True
            while not self.block_manager.can_allocate(seq, num_new):
                at = self._victim(running)
                victim = running.pop(at)
                index -= at < index  # a victim already scheduled this step: the rest moved up
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break  # the sequence preempted itself: it was the newest (or least urgent)
            draft = self._take_draft(seq, num_new, budget)
            num_new += len(draft.token_ids) if draft is not None else 0
            self._schedule(out, seq, num_new, images, draft)
            budget -= num_new
            index += 1
        return budget, False

    def _ends_with_pending_token(self, seq: Sequence) -> bool:
        """Whether the tokens the steps in flight sample reach max_tokens or the context limit."""
        generated = len(seq.output_token_ids) + seq.num_placeholders
        limit = seq.params.max_tokens if seq.params.max_tokens is not None else self.max_model_len
        return generated >= limit or seq.num_tokens + seq.num_placeholders >= self.max_model_len

    def advance(self, sched: SchedulerOutput) -> None:
        """Async scheduling: the submitted step counts as computed now, and each sequence it samples holds a
        placeholder until update_from_output appends the token — so the next step can be scheduled at once."""
        for item in sched.scheduled:
            samples = item.samples  # read before the tokens count as computed
            item.seq.num_computed_tokens += item.num_new_tokens
            item.seq.num_placeholders += 1 if samples else 0
        sched.advanced = True

    def _passes_rope_switch(self, seq: Sequence) -> bool:
        """LongRoPE: a sequence that started within the pretraining length cached short-factor keys; the
        first time it grows past that length transformers recomputes its whole cache with the long
        factors (Phi3ForCausalLM.prepare_inputs_for_generation), and so does llmctl."""
        switch = self.rope_switch_length
        return switch is not None and not seq.rope_recomputed and len(seq.prompt_token_ids) <= switch \
            and 0 < seq.num_computed_tokens <= switch < seq.num_tokens

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
            pooled_whole = self.pool_whole_prompts and seq.pooling is not None
            if not pooled_whole:
                self.block_manager.match_prefix(seq)
            self.block_manager.release_slid_out(seq)
            whole = pooled_whole or not self.chunked_prefill
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if self.long_prefill_token_threshold and not whole:
                num_new = min(num_new, self.long_prefill_token_threshold)
            num_new, images = self._fit_encoder(seq, num_new, out)
            if num_new <= 0 or (whole and num_new < seq.num_tokens - seq.num_computed_tokens):
                break  # a prompt that runs whole waits for a step with room for all of it
            if not self.block_manager.can_allocate(seq, num_new):
                if not self.running and not out.scheduled and not whole:
                    # Alone it does not fit a whole prompt: take what fits, chunked.
                    num_new = min(num_new, self._tokens_that_fit(seq))
                    if num_new <= 0:
                        break
                else:
                    break
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(out, seq, num_new, images)
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
        if self.scheduling_policy == "priority":
            self._queue_by_priority(seq)
        else:
            self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def finish(self, seq: Sequence, reason: str | None = None, stop_reason: str | int | None = None) -> None:
        """Remove a finished or aborted sequence and free its blocks at once."""
        if reason is not None:
            seq.finish_reason, seq.stop_reason = reason, stop_reason
            seq.timings.finished = time.perf_counter()
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        if self.encoder is not None:
            self.encoder.release(seq)
        seq.status = SequenceStatus.FINISHED

    def abort(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self.finish(seq)

    def fail_unschedulable(self) -> Sequence:
        """Finish the first waiting sequence, which can never fit (is_stuck)."""
        seq = self.waiting[0]
        self.finish(seq, "length")
        return seq

    # -- after a step -------------------------------------------------------------------
    def update_from_output(self, sched: SchedulerOutput, sampled: list[SampledSeq], text: TokenText,
                           pooled: dict[int, object] | None = None) -> set[str]:
        """Apply a step's result (sampled tokens; pooled outputs of pooling requests whose prompt is done);
        returns the ids of the requests that advanced."""
        for item in sched.scheduled:
            if not item.seq.is_finished:  # aborted while its batch was in flight
                # Proposed tokens count as computed only once verified (below).
                if not sched.advanced:
                    item.seq.num_computed_tokens += item.num_new_tokens - item.num_draft_tokens
                self.block_manager.register_full_blocks(item.seq)
        if sched.advanced:
            for result in sampled:
                result.seq.num_placeholders -= 1
        for result in sampled:  # all siblings first: a parent that ends at its first token frees its blocks
            if result.forked_from is not None:
                self._add_sibling(result.forked_from, result.seq)
        touched: set[str] = set()
        now = time.perf_counter()
        for item in sched.scheduled:
            if pooled and item.seq.seq_id in pooled and not item.seq.is_finished:
                self._finish_pooled(item.seq, pooled[item.seq.seq_id], now)
                touched.add(item.seq.request_id)
        for result in sampled:
            if result.seq.is_finished:
                continue
            self._append(result, text, now)
            touched.add(result.seq.request_id)
        for item in sched.scheduled:
            if item.draft is not None and item.seq.status == SequenceStatus.RUNNING:
                self.block_manager.trim(item.seq)  # blocks of rejected proposals
        return touched

    def _finish_pooled(self, seq: Sequence, output: object, now: float) -> None:
        """A pooling request is done when its prompt is: its blocks go back at once (no decode follows)."""
        seq.pooled = output
        self.counts.prompt_tokens += len(seq.prompt_token_ids)
        seq.timings.first_token = seq.timings.last_token = now
        self.finish(seq, "stop")

    def _add_sibling(self, parent: Sequence, child: Sequence) -> None:
        self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)

    def _append(self, result: SampledSeq, text: TokenText, now: float) -> None:
        """Each token is checked for stops as it is appended; tokens after a stop are dropped."""
        seq = result.seq
        for token, logprob in result.tokens:
            self._append_token(seq, token, logprob, now)
            self._check_stop(seq, token, text)
            if seq.is_finished:
                return
        if result.verified:
            seq.num_computed_tokens += len(result.tokens) - 1  # the accepted proposals' K/V was written
            self.block_manager.register_full_blocks(seq)

    def _append_token(self, seq: Sequence, token: int, logprob: TokenLogprob | None, now: float) -> None:
        if not seq.output_token_ids and seq.index == 0:
            self.counts.prompt_tokens += len(seq.prompt_token_ids)
        seq.output_token_ids.append(token)
        if seq.grammar is not None and not seq.grammar.is_terminated:
            seq.grammar.accept(token)  # the grammar allowed it: the bitmask masked everything else
        self.counts.generation_tokens += 1
        if logprob is not None:
            seq.output_logprobs.append(logprob)
        seq.timings.first_token = seq.timings.first_token or now
        seq.timings.last_token = now

    def _check_stop(self, seq: Sequence, token: int, text: TokenText) -> None:
        """In vLLM's order: EOS, stop token ids, stop strings (none before min_tokens), then length."""
        params = seq.params
        generated = len(seq.output_token_ids)
        can_stop = generated >= params.min_tokens
        if can_stop and not params.ignore_eos and token in self.eos_token_ids:
            text.add_token(seq, search_stop_strings=False)
            return self.finish(seq, "stop", None)
        if can_stop and token in params.stop_token_ids:
            text.add_token(seq, search_stop_strings=False)
            return self.finish(seq, "stop", token)
        stop = text.add_token(seq, search_stop_strings=can_stop and bool(params.stop))
        if stop is not None:
            return self.finish(seq, "stop", stop)
        limit = params.max_tokens if params.max_tokens is not None else self.max_model_len
        if generated >= limit or seq.num_tokens >= self.max_model_len:
            self.finish(seq, "length", None)


def _rank(seq: Sequence) -> tuple[int, int]:
    """Priority scheduling's order: lower priority value first, then earlier arrival (vLLM's)."""
    return seq.params.priority, seq.seq_id
