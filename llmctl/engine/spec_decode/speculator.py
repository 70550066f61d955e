"""The engine's one seam for speculative decoding: which sequences propose, how many tokens,
and the counters. The engine calls `observe` for every batch it submits, `propose` after
each step, and `record` for each verified proposal."""

from __future__ import annotations

import torch

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.scheduler import SchedulerOutput
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.spec_decode.config import SpeculativeConfig
from llmctl.engine.spec_decode.draft_model import DraftModelProposer
from llmctl.engine.spec_decode.eagle import eagle_proposer
from llmctl.engine.spec_decode.eagle3 import eagle3_proposer
from llmctl.engine.spec_decode.hidden_proposer import HiddenStateProposer
from llmctl.engine.spec_decode.mtp import mtp_proposer
from llmctl.engine.spec_decode.ngram import propose_ngram
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.spec_decode.stats import SpecDecodeStats
from llmctl.engine.worker.loaded_model import LoadedModel


class Speculator:
    def __init__(self, spec_config: SpeculativeConfig, config: EngineConfig, target: LoadedModel,
                 generator: torch.Generator) -> None:
        self.config = spec_config
        self.max_model_len = target.max_model_len
        self.stats = SpecDecodeStats(spec_config.num_speculative_tokens)
        self.draft_model = DraftModelProposer(spec_config, config, target, generator) \
            if spec_config.method == "draft_model" else None
        self.hidden: HiddenStateProposer | None = \
            eagle_proposer(spec_config, config, target, generator) if spec_config.method == "eagle" else \
            eagle3_proposer(spec_config, config, target, generator) if spec_config.method == "eagle3" else \
            mtp_proposer(config, target, generator) if spec_config.method == "mtp" else None

    @staticmethod
    def create(config: EngineConfig, target: LoadedModel, generator: torch.Generator) -> Speculator | None:
        spec_config = config.speculative
        if spec_config is None:
            return None
        return Speculator(spec_config, config, target, generator)

    def reset_stats(self) -> None:
        self.stats = SpecDecodeStats(self.config.num_speculative_tokens)

    def describe(self) -> str:
        return self.config.describe()

    def observe(self, batch: StepBatch, sched: SchedulerOutput) -> None:
        if self.draft_model is not None:
            self.draft_model.observe(batch)
        if self.hidden is not None:
            self.hidden.observe(batch, sched)

    def propose(self, seqs: list[Sequence], num_running: int, block_manager: BlockManager) -> None:
        """Set `seq.draft` for the decoding sequences that can speculate on their next step
        (none while `num_running` reaches disable_by_batch_size)."""
        limit = self.config.disable_by_batch_size
        off = limit is not None and num_running >= limit
        ks = [0 if off else self._budget(seq) for seq in seqs]
        if self.hidden is not None:  # its catch-up runs even when nothing is proposed: it keeps the head's KV
            drafts = self.hidden.propose(seqs, ks, block_manager)
        elif off:
            drafts = [None] * len(seqs)
        elif self.draft_model is not None:
            drafts = self.draft_model.propose(seqs, ks, block_manager)
        else:
            cfg = self.config
            drafts = [Draft(tokens) if (tokens := propose_ngram(seq.all_token_ids, cfg.prompt_lookup_min,
                                                                cfg.prompt_lookup_max, k)) else None
                      if k > 0 else None for seq, k in zip(seqs, ks)]
        for seq, draft in zip(seqs, drafts):
            seq.draft = draft if draft is not None and draft.token_ids else None

    def _budget(self, seq: Sequence) -> int:
        """How many tokens a sequence may propose: none when its request opts out or while settings
        that depend on each emitted token apply (penalties, min_tokens, biases, allowed and bad words;
        a grammar's mask is applied in verification); never past max_tokens or the context."""
        params = seq.params
        if params.disable_spec_decode or seq.is_finished or seq.in_prefill or seq.num_tokens - seq.num_computed_tokens != 1:
            return 0
        if params.logit_bias or params.allowed_token_ids or params.bad_words_token_ids:
            return 0  # they change each row's distribution; verification reads the target's own
        if (params.repetition_penalty or 1.0) != 1.0 or params.presence_penalty or params.frequency_penalty:
            return 0
        generated = len(seq.output_token_ids)
        if generated < params.min_tokens:
            return 0
        limit = params.max_tokens if params.max_tokens is not None else self.max_model_len
        return max(0, min(self.config.num_speculative_tokens, limit - generated - 1,
                          self.max_model_len - seq.num_tokens - 1))
