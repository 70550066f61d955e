"""Speculative decoding from a head that reads the target's hidden states (EAGLE-3: llmctl.engine.spec_decode.eagle3;
DeepSeek's multi-token prediction: .mtp), as vLLM's EagleProposer runs both, with the head's own paged KV cache
indexed by the target's block tables.

After every target step, a catch-up pass runs the head over the positions the step computed and kept: at
position p it reads the token at p + 1 (now known: the prompt, accepted drafts, the sampled token) and the target's
hidden states at p, and writes its KV there — so wherever the target's KV is valid the head's is too. The
catch-up's last row of each proposing sequence gives the first draft token; each further one is a chained step at
the next position, reading the token just drafted and the head's own hidden state. The target verifies the chain
with the existing rejection sampler, so outputs stay exact."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from llmctl.engine.attention_selector import create_backend
from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.scheduler import SchedulerOutput
from llmctl.engine.core.sequence import Sequence, SequenceStatus
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.spec_decode.draft_sampling import draw
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.worker.loaded_model import LoadedModel
from llmctl.engine.worker.model_runner import ModelRunner

HEAD_LAYER = 0  # the head's one attention layer, as its KV cache is keyed


@dataclass
class _Rows:
    """One sequence's rows in a draft batch."""
    seq: Sequence
    positions: list[int]
    proposes: bool


class HiddenStateProposer:
    def __init__(self, head: Any, cache: KVCache, target: LoadedModel, target_states: Callable[[], Any],
                 block_size: int, generator: torch.Generator) -> None:
        """`head`: forward(input_ids, ctx, hidden) -> its normed output, keeping `prenorm` (the next chained
        step's hidden state), and compute_logits(normed) over the target's vocabulary; `target_states()`: the
        target's hidden states of its last forward, one row per token, that the head reads."""
        self.head, self.target_states = head, target_states
        self.block_size, self.generator = block_size, generator
        backend = create_backend(target.backend.name, target.dtype, cache.kv.shape[-1])
        self.runner = ModelRunner(head, {HEAD_LAYER: cache}, backend, block_size, target.device)
        self._last: tuple[SchedulerOutput, StepBatch, torch.Tensor] | None = None
        self._row_of: dict[int, int] = {}  # seq_id -> its row in the head's last output (proposing sequences)

    def observe(self, batch: StepBatch, sched: SchedulerOutput) -> None:
        """The target's step: its batch and the hidden states the head reads, for the catch-up."""
        states = self.target_states()
        if batch.num_tokens and states is not None:
            self._last = (sched, batch, states)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int], block_manager: BlockManager) -> list[Draft | None]:
        """The catch-up (always: it keeps the head's KV), then up to k chained tokens per sequence with a budget."""
        budget = {seq.seq_id: k for seq, k in zip(seqs, ks)
                  if k > 0 and block_manager.can_allocate_in_place(seq, 1 + k)}
        for seq in seqs:
            if seq.seq_id in budget:
                block_manager.allocate(seq, 1 + budget[seq.seq_id])
        live, logits = self._catch_up(budget)
        tokens: dict[int, list[int]] = {seq.seq_id: [] for seq in live}
        probs: dict[int, list[torch.Tensor]] = {seq.seq_id: [] for seq in live}
        for step in range(max(budget.values(), default=0)):
            if step > 0:
                live = [seq for seq in live if budget[seq.seq_id] > step]
                if not live:
                    break
                logits = self._chain_step(live, [tokens[seq.seq_id][-1] for seq in live], step)
            chosen, q = draw(logits, live, self.generator)
            for row, seq in enumerate(live):
                tokens[seq.seq_id].append(chosen[row])
                probs[seq.seq_id].append(q[row])
        return [Draft(tokens[seq.seq_id], None if seq.params.greedy else torch.stack(probs[seq.seq_id]))
                if tokens.get(seq.seq_id) else None for seq in seqs]

    def _catch_up(self, budget: dict[int, int]) -> tuple[list[Sequence], torch.Tensor]:
        """The head over the last target step's kept positions: (the sequences that propose, the logits at each
        one's last position)."""
        last, self._last = self._last, None
        if last is None:
            return [], torch.empty(0)
        sched, batch, aux = last
        rows: list[_Rows] = []
        hidden_rows: list[int] = []
        for index, item in enumerate(sched.scheduled):
            seq, first_row = item.seq, batch.query_start_loc[index]
            start = batch.positions[first_row]
            kept = min(seq.num_computed_tokens - start, item.num_new_tokens)
            if seq.status != SequenceStatus.RUNNING or kept <= 0:
                continue
            rows.append(_Rows(seq, list(range(start, start + kept)), seq.seq_id in budget))
            hidden_rows += range(first_row, first_row + kept)
        if not rows:
            return [], torch.empty(0)
        tokens = [r.seq.all_token_ids[p + 1] for r in rows for p in r.positions]
        logits = self._run(rows, tokens, aux[torch.tensor(hidden_rows, device=aux.device)])
        return [r.seq for r in rows if r.proposes], logits

    def _chain_step(self, live: list[Sequence], last_tokens: list[int], step: int) -> torch.Tensor:
        """One drafted token per sequence at the next position, on the head's own hidden state of the last one."""
        prenorm = self.head.prenorm
        assert prenorm is not None, "a chained step follows a head step"
        hidden = prenorm[torch.tensor([self._row_of[seq.seq_id] for seq in live], device=prenorm.device)]
        return self._run([_Rows(seq, [seq.num_tokens - 2 + step], True) for seq in live], last_tokens, hidden)

    def _run(self, rows: list[_Rows], tokens: list[int], hidden: torch.Tensor) -> torch.Tensor:
        """The head over `rows` (its KV written at their positions); the logits of the proposing ones' last rows."""
        size, starts = self.block_size, [0]
        for r in rows:
            starts.append(starts[-1] + len(r.positions))
        self._row_of = {r.seq.seq_id: end - 1 for r, end in zip(rows, starts[1:]) if r.proposes}
        batch = StepBatch(input_ids=tokens, positions=[p for r in rows for p in r.positions],
                          slot_mapping=[r.seq.block_table[p // size] * size + p % size for r in rows for p in r.positions],
                          query_start_loc=starts, seq_lens=[r.positions[-1] + 1 for r in rows],
                          block_tables=[r.seq.block_table for r in rows], sample_rows=list(self._row_of.values()))
        normed = self.runner.forward(batch, hidden)
        if not self._row_of:
            return torch.empty(0)
        return self.head.compute_logits(normed[torch.tensor(list(self._row_of.values()), device=normed.device)])
