"""What crosses between the driver and its workers each step: one small, picklable message
each way (the batch out; logits, or sampled ids from a pipeline's last stage, back)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from llmctl.engine.core.sequence import Sequence, TokenLogprob
from llmctl.engine.sampling_params import SamplingParams


@dataclass
class SampleInput:
    """What sampling one row needs; small and picklable."""

    params: SamplingParams
    uniform: float  # drawn from the request's generator (0.0 for a greedy row, which draws nothing)
    blocked_token_ids: list[int]  # EOS and stop ids while min_tokens is not reached
    seen_token_ids: list[int] = field(default_factory=list)  # distinct prompt + output ids: repetition penalty
    output_token_ids: list[int] = field(default_factory=list)  # the output so far: presence/frequency penalties
    token_bitmask: torch.Tensor | None = None  # structured outputs: int32 words, the tokens the grammar allows

    @classmethod
    def for_sequence(cls, seq: Sequence, params: SamplingParams, generator: torch.Generator,
                     blocked_token_ids: list[int], token_bitmask: torch.Tensor | None = None) -> SampleInput:
        """Draws the row's uniform now: the draws of a request stay in its token order wherever it samples."""
        uniform = 0.0 if params.greedy else torch.rand(1, generator=generator).item()
        seen = sorted(set(seq.all_token_ids)) if (params.repetition_penalty or 1.0) != 1.0 else []
        output = list(seq.output_token_ids) if params.presence_penalty or params.frequency_penalty else []
        return cls(params, uniform, blocked_token_ids, seen, output, token_bitmask)


@dataclass
class TableUpdate:
    """Row `row` of every KV group's table from entry `start` on is `blocks[group]` (and ends there)."""

    row: int
    start: int
    blocks: list[list[int]]  # per KV group; slid-out entries as block 0 (the window mask hides them)


@dataclass
class EncoderInput:
    content_hash: str
    data: dict[str, torch.Tensor]  # what the model's image encoder takes for this one image


@dataclass
class EmbeddingSlice:
    """Rows `rows` of the step take rows `sources` of the encoder output cached under `content_hash`."""

    content_hash: str
    rows: list[int]
    sources: list[int]


@dataclass(frozen=True)
class HostCopy:
    """One block between the device pool and the KV cache's CPU tier (llmctl.engine.core.host_tier)."""

    store: bool  # True: device block -> host slot; False: host slot -> device block
    block: int
    slot: int


@dataclass
class StepBatch:
    """One step, flat: T new tokens of B sequences. Small and picklable."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]  # cache slot (block * block_size + offset) of each new token
    query_start_loc: list[int]  # [B + 1]
    seq_lens: list[int]  # [B] tokens in the cache after this step
    block_tables: list[list[int]]
    sample_rows: list[int]  # last token of each sequence that samples (and each of its proposed tokens)
    prompt_rows: dict[int, list[int]] = field(default_factory=dict)  # seq_id -> rows scoring prompt tokens
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)
    lora_slots: list[int] = field(default_factory=list)  # [B] each sequence's adapter slot; empty: no adapters
    sampling: list[SampleInput] | None = None  # one per sample row: the last pipeline stage samples them
    total_lens: list[int] = field(default_factory=list)  # [B] each sequence's known tokens (LongRoPE); may be empty
    # hybrid KV cache (llmctl.sizing.kv.KVGroups): slot_mapping and block_tables are the first group's, these the rest's
    group_slot_mappings: list[list[int]] = field(default_factory=list)
    group_block_tables: list[list[list[int]]] = field(default_factory=list)
    # tables sent as changes (llmctl.engine.core.table_updates): each sequence's row in the workers' copy, and
    # what to write there first; the worker then fills block_tables / group_block_tables from its copy
    table_rows: list[int] = field(default_factory=list)
    table_updates: list[TableUpdate] = field(default_factory=list)
    exchange_experts: bool = False  # EP across replicas: MoE layers meet the other replicas' tokens (lockstep)
    # async scheduling (llmctl.engine.executor.overlap): (input row, sample row of the step before) of each token
    # that step is still sampling; filled on the device by the runner, or on the host by the step thread (TP)
    placeholders: list[tuple[int, int]] = field(default_factory=list)
    # vision-language models (llmctl.engine.multimodal): images to encode into the workers' encoder cache, outputs
    # to drop from it, and where cached outputs replace token embeddings in this step
    encoder_inputs: list[EncoderInput] = field(default_factory=list)
    encoder_frees: list[str] = field(default_factory=list)
    embedding_slices: list[EmbeddingSlice] = field(default_factory=list)
    mrope_positions: list[list[int]] = field(default_factory=list)  # M-RoPE: [3][T] (t, h, w); empty: positions
    both_ways_spans: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, first, last) attending both ways
    pool_spans: dict[int, tuple[int, int]] = field(default_factory=dict)  # pooling: seq_id -> its rows (first, end)
    state_slots: list[int] = field(default_factory=list)  # [B] recurrent layers: each sequence's state slot
    host_copies: list[HostCopy] = field(default_factory=list)  # the KV CPU tier's, in order, before block_copies

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class StepLogits:
    sample_logits: torch.Tensor  # [N, V] float32 on the model's device, one row per sampling sequence
    prompt_logits: dict[int, torch.Tensor]  # seq_id -> [rows, V]
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)  # pooling: seq_id -> its pooled output (host)


@dataclass
class SampledTokens:
    """What a pipeline's last stage returns for a batch with `sampling`: ids, not logits."""

    tokens: list[tuple[int, TokenLogprob | None]]  # one per sample row
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)  # as StepLogits.pooled


@dataclass
class StepFailed:
    """Sent back instead of a result when a step failed for its requests (the rank itself is fine)."""

    reason: str
