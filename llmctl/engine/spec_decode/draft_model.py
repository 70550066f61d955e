"""A draft model run by our own engine parts, with its own paged KV cache.

The draft's KV pool has as many blocks as the target's and is indexed by the same block
tables, so a slot means the same position in both caches. The draft runs every batch the
target runs (prompts, prefix-cache misses, verified proposals), so wherever the target's
KV is valid the draft's is too — prefix caching and preemption need nothing extra. Before
proposing, the proposer gives each sequence the blocks its next k + 1 tokens need (the
scheduler then finds them there); the k one-token draft steps write the draft's cache at
those positions, which the next target batch rewrites with the verified tokens.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from llmctl.checkpoint.config_file import load_spec
from llmctl.checkpoint.source import resolve_model
from llmctl.engine.config import EngineConfig
from llmctl.engine.core.block_manager import BlockManager
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import StepBatch
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.spec_decode.config import SpeculativeConfig
from llmctl.engine.spec_decode.draft_sampling import draw
from llmctl.engine.spec_decode.proposal import Draft
from llmctl.engine.worker.loaded_model import LoadedModel
from llmctl.engine.worker.loader import load_model
from llmctl.engine.worker.model_runner import make_runner
from llmctl.sizing.kv import stage_kv
from llmctl.units import GiB

logger = logging.getLogger("llmctl.engine")


class DraftModelProposer:
    def __init__(self, spec_config: SpeculativeConfig, config: EngineConfig, target: LoadedModel,
                 generator: torch.Generator) -> None:
        self.k = spec_config.num_speculative_tokens
        self.block_size = config.block_size
        self.generator = generator  # for requests without a seed of their own
        self.loaded = _load_draft(spec_config, config, target)
        self.runner = make_runner(self.loaded, config.block_size)
        self.vocab = target.spec.vocab_size  # the draft's distributions are over the target's ids

    def observe(self, batch: StepBatch) -> None:
        """Run the target's batch through the draft, so its cache holds the same positions."""
        if batch.num_tokens:
            self.runner.forward(batch)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int], block_manager: BlockManager) -> list[Draft | None]:
        """Up to k tokens per sequence, drawn from the draft with each request's settings."""
        drafts: list[Draft | None] = [None] * len(seqs)
        active = []
        for index, (seq, k) in enumerate(zip(seqs, ks)):
            # A shared last block would need its copy-on-write made in the target's cache first: no proposal.
            if k > 0 and block_manager.can_allocate_in_place(seq, 1 + k):
                block_manager.allocate(seq, 1 + k)
                active.append(index)
        if not active:
            return drafts
        tokens = {i: [seqs[i].output_token_ids[-1]] for i in active}
        probs: dict[int, list[torch.Tensor]] = {i: [] for i in active}
        for step in range(max(ks[i] for i in active)):
            rows = [i for i in active if ks[i] > step]
            logits = self._step([seqs[i] for i in rows], [tokens[i][-1] for i in rows], step)
            chosen, q = draw(logits, [seqs[i] for i in rows], self.generator)
            for row, i in enumerate(rows):
                tokens[i].append(chosen[row])
                probs[i].append(q[row])
        for i in active:
            drafts[i] = Draft(tokens[i][1:], None if seqs[i].params.greedy else torch.stack(probs[i]))
        return drafts

    def _step(self, seqs: list[Sequence], last_tokens: list[int], step: int) -> torch.Tensor:
        """One token per sequence at position num_tokens - 1 + step; returns the draft's logits."""
        size = self.block_size
        positions = [seq.num_tokens - 1 + step for seq in seqs]
        batch = StepBatch(
            input_ids=last_tokens, positions=positions,
            slot_mapping=[seq.block_table[p // size] * size + p % size for seq, p in zip(seqs, positions)],
            query_start_loc=list(range(len(seqs) + 1)), seq_lens=[p + 1 for p in positions],
            block_tables=[seq.block_table for seq in seqs], sample_rows=list(range(len(seqs))))
        logits = self.runner.logits(batch, self.runner.forward(batch)).sample_logits[:, :self.vocab]
        if logits.shape[1] < self.vocab:  # ids the draft cannot produce
            logits = torch.nn.functional.pad(logits, (0, self.vocab - logits.shape[1]), value=float("-inf"))
        return logits


def _load_draft(spec_config: SpeculativeConfig, config: EngineConfig, target: LoadedModel) -> LoadedModel:
    """The draft with exactly the target's number of KV blocks, on the target's device and dtype."""
    source = resolve_model(spec_config.model, weights=False)
    spec = load_spec(source)
    if spec.max_context and spec.max_context < target.max_model_len:
        raise SpeculativeConfigError(
            f"the draft model {spec_config.model} has a context of {spec.max_context} tokens, shorter than the "
            f"target's --max-model-len {target.max_model_len}: use --max-model-len {spec.max_context} or less, or "
            "a draft with a longer context")
    element = torch.tensor([], dtype=target.kv_caches[next(iter(target.kv_caches))].kv.dtype).element_size()
    geometry = stage_kv(spec, 1, range(spec.num_layers), element, config.block_size)
    blocks = target.kv_pool.num_blocks
    draft_config = replace(config, model=spec_config.model, revision=None, tokenizer=None,
                           max_model_len=target.max_model_len, kv_cache_memory=blocks * geometry.block_bytes,
                           enforce_eager=True, speculative_config=None, enable_lora=False, device=str(target.device),
                           dtype=str(target.dtype).removeprefix("torch."))
    loaded = load_model(draft_config)
    _check_same_tokenizer(loaded, target, spec_config.model)
    if loaded.kv_pool.num_blocks < blocks:
        raise SpeculativeConfigError(f"the draft model's KV cache got {loaded.kv_pool.num_blocks} blocks, the "
                                     f"target's has {blocks}")
    logger.info("draft model %s: weights %.2f GiB, KV cache %.2f GiB (%d blocks, the target's block tables)",
                spec_config.model, loaded.weights_bytes / GiB, loaded.kv_cache_bytes / GiB, blocks)
    return loaded


def _check_same_tokenizer(draft: LoadedModel, target: LoadedModel, name: str | None) -> None:
    if draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise SpeculativeConfigError(
            f"the draft model {name} has a different tokenizer from the target's: a draft must share the "
            "target's vocabulary (use a smaller model of the same family)")
    if draft.spec.vocab_size < len(target.tokenizer):
        raise SpeculativeConfigError(f"the draft model {name} has {draft.spec.vocab_size} logits for a "
                                     f"{len(target.tokenizer)}-token vocabulary")
