"""Sampling on the driver: a step's logits become each sequence's next token (or, with
speculative decoding, its verified proposals), after the prompt log-probabilities are
recorded and the siblings of an n > 1 request are forked at its first token."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from llmctl.engine.core.scheduler import SampledSeq, SchedulerOutput
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import SampledTokens, SampleInput, StepLogits
from llmctl.engine.sample.bad_words import blocked_by_bad_words
from llmctl.engine.sample.rejection import VerifyInput, verify
from llmctl.engine.sample.sampler import prompt_logprob_entries, sample
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.spec_decode.speculator import Speculator
from llmctl.engine.structured.manager import StructuredOutputManager

NewSibling = Callable[[Sequence, int], Sequence]  # (first sequence, index) -> a new sequence of its request


class StepSampler:
    def __init__(self, eos_token_ids: list[int], generator: torch.Generator, new_sibling: NewSibling,
                 speculator: Speculator | None = None, structured: StructuredOutputManager | None = None) -> None:
        self.eos_token_ids = eos_token_ids
        self.generator = generator  # for requests without a seed
        self.new_sibling = new_sibling
        self.speculator = speculator  # counts accepted proposals
        self.structured = structured  # token bitmasks of sequences with a grammar
        self._masks: dict[int, Future[torch.Tensor | None]] = {}  # seq id -> its bitmask, computed beside the forward
        self._mask_thread: ThreadPoolExecutor | None = None

    def prefetch_bitmasks(self, seqs: list[Sequence]) -> None:
        """Start the step's grammar bitmasks on a thread while the forward runs (as vLLM overlaps them with
        the GPU): a matcher only moves when the step's tokens are appended, after sampling has read its mask.
        xgrammar and llguidance fill masks outside the GIL."""
        grammars = [seq for seq in seqs if seq.grammar is not None]
        if not grammars or self.structured is None:
            return
        if self._mask_thread is None:
            self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="llmctl-bitmask")
        for seq in grammars:
            self._masks[seq.seq_id] = self._mask_thread.submit(self.structured.bitmask, seq.grammar)

    def sample_input(self, seq: Sequence) -> SampleInput:
        params = seq.params
        blocked: list[int] = []
        if len(seq.output_token_ids) + seq.num_placeholders < params.min_tokens:
            blocked = sorted(set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids)))
        if params.bad_words_token_ids:
            blocked = sorted(set(blocked) | set(blocked_by_bad_words(params.bad_words_token_ids,
                                                                     seq.output_token_ids)))
        prefetched = self._masks.pop(seq.seq_id, None)
        if prefetched is not None:
            bitmask = prefetched.result()
        else:
            bitmask = self.structured.bitmask(seq.grammar) if seq.grammar is not None and self.structured else None
        return SampleInput.for_sequence(seq, params, seq.generator or self.generator, blocked, bitmask)

    def sample_step(self, sched: SchedulerOutput, result: StepLogits | SampledTokens,
                    sample_seqs: list[Sequence]) -> list[SampledSeq]:
        """The step's tokens per sequence, in the order they are appended."""
        if isinstance(result, SampledTokens):  # the last pipeline stage sampled (batch.sampling)
            return [SampledSeq(seq, [token]) for seq, token in zip(sample_seqs, result.tokens)]
        record_prompt_logprobs(result.prompt_logits, {item.seq.seq_id: item.seq for item in sched.scheduled})
        drafts = {item.seq.seq_id: item.draft for item in sched.scheduled if item.draft is not None}
        plain: list[SampledSeq] = []
        inputs, rows = [], []
        verifying: list[tuple[Sequence, VerifyInput]] = []
        next_row = 0
        for seq in sample_seqs:
            row, draft = next_row, drafts.get(seq.seq_id)
            next_row += 1 + (len(draft.token_ids) if draft is not None else 0)
            if seq.is_finished:  # aborted while its batch was in flight
                continue
            if draft is not None:
                draft, masks = self._grammar_rows(seq, draft)
                verifying.append((seq, VerifyInput(seq.params, seq.generator or self.generator, draft, row, masks)))
                continue
            for member in [SampledSeq(seq, [])] + self._fork(seq):
                inputs.append(self.sample_input(member.seq))
                plain.append(member)
                rows.append(row)
        if inputs:
            logits = result.sample_logits
            if rows != list(range(logits.shape[0])):  # some rows finished, forked, or belong to proposals
                logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
            for member, token in zip(plain, sample(logits, inputs)):
                member.tokens.append(token)
        for seq in sample_seqs:  # masks of sequences that did not sample (aborted, verified) are dropped
            self._masks.pop(seq.seq_id, None)
        return plain + self._verify(result.sample_logits, verifying)

    def _grammar_rows(self, seq: Sequence, draft: Draft) -> tuple[Draft, torch.Tensor | None]:
        """A grammar-constrained sequence's draft, cut at the first token its grammar refuses, and the mask
        of each of its rows: the matcher walks the draft and is rolled back to where it was."""
        if seq.grammar is None or self.structured is None:
            return draft, None
        rows, walked = [], 0
        for token in draft.token_ids + [None]:
            mask = self.structured.bitmask(seq.grammar)
            rows.append(mask if mask is not None else self.structured.full_row())
            if token is None or seq.grammar.is_terminated or not seq.grammar.accept(token):
                break
            walked += 1
        seq.grammar.rollback(walked)
        return draft.truncated(len(rows) - 1), torch.stack(rows)

    def _fork(self, seq: Sequence) -> list[SampledSeq]:
        """At the first token of an n > 1 request: its siblings, sampled from the same logits row."""
        if not seq.waiting_to_fork:
            return []
        seq.waiting_to_fork = False
        siblings = []
        for index in range(1, seq.params.n):
            child = self.new_sibling(seq, index)
            child.prompt_logprobs = list(seq.prompt_logprobs)
            siblings.append(SampledSeq(child, [], forked_from=seq))
        return siblings

    def _verify(self, logits: torch.Tensor, verifying: list[tuple[Sequence, VerifyInput]]) -> list[SampledSeq]:
        if not verifying:
            return []
        emitted = verify(logits, [item for _, item in verifying])
        for (_, item), tokens in zip(verifying, emitted):
            if self.speculator is not None:
                self.speculator.stats.record(len(item.draft.token_ids), len(tokens) - 1)
        return [SampledSeq(seq, tokens, verified=True) for (seq, _), tokens in zip(verifying, emitted)]


def record_prompt_logprobs(prompt_logits: dict[int, torch.Tensor], seqs: dict[int, Sequence]) -> None:
    """Logits at position p score prompt token p + 1; entry 0 (no context) is None. Runs before the
    step's tokens count as computed, so num_computed_tokens is where the chunk started."""
    for seq_id, logits in prompt_logits.items():
        seq = seqs[seq_id]
        if not seq.prompt_logprobs:
            seq.prompt_logprobs.append(None)
        first_target = seq.num_computed_tokens + 1
        skip = len(seq.prompt_logprobs) - first_target  # already scored before a preemption
        if skip < 0:
            continue
        targets = seq.prompt_token_ids[first_target + skip:first_target + logits.shape[0]]
        if not targets:  # a recomputed chunk whose prompt tokens were all scored the first time
            continue
        seq.prompt_logprobs += prompt_logprob_entries(logits[skip:skip + len(targets)], targets,
                                                      seq.params.prompt_logprobs or 0)
