"""A Sequence: one prompt and the tokens generated for it, as the scheduler sees it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmctl.engine.multimodal.items import MultimodalItem, block_keys
from llmctl.engine.multimodal.mrope import MRopePositions
from llmctl.engine.pooling.params import PoolingParams
from llmctl.engine.sampling_params import SamplingParams
from llmctl.engine.spec_decode.proposal import Draft

if TYPE_CHECKING:
    from llmctl.engine.lora.adapter import LoRAAdapter
    from llmctl.engine.structured.matcher import GrammarMatcher


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top: dict[int, float] = field(default_factory=dict)  # alternatives: token id -> logprob


@dataclass
class Timings:
    arrival: float = field(default_factory=time.perf_counter)
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    finished: float | None = None
    model_forward: float | None = None  # seconds, summed over its steps (--collect-detailed-traces model)
    model_execute: float | None = None  # seconds, summed over its steps (--collect-detailed-traces worker)


@dataclass
class Sequence:
    seq_id: int
    request_id: str
    index: int  # which of the request's n completions
    prompt_token_ids: list[int]
    params: SamplingParams
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache (async scheduling: or being written)
    num_placeholders: int = 0  # async scheduling: tokens sampled by steps in flight, not appended yet
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache
    block_table: list[int] = field(default_factory=list)  # the first KV group's (the only one, most models)
    group_tables: list[list[int]] = field(default_factory=list)  # the other KV groups' (hybrid models: Gemma)
    num_slid_out_blocks: int = 0  # leading entries of the sliding groups' tables given back (sliding window)
    # lowest block-table entry rewritten in place (not appended) since the workers were last sent the tables
    # (llmctl.engine.core.table_updates): copy-on-write, slid out, trimmed, freed
    tables_changed_from: int = 0
    block_hashes: list[int] = field(default_factory=list)  # hashes of the full blocks registered so far
    state_slot: int = -1  # recurrent layers (Mamba2): its slot in the state cache while it holds blocks
    output_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    generator: object | None = None  # torch.Generator for seeded sampling
    timings: Timings = field(default_factory=Timings)
    waiting_to_fork: bool = False  # n > 1: the siblings are created when the prompt is done
    num_preemptions: int = 0
    rope_recomputed: bool = False  # LongRoPE: its short-factor cache was recomputed with the long factors
    lane: int = 0  # pipeline parallel: which of the PP batches in flight this sequence rides in
    draft: Draft | None = None  # speculative decoding: tokens proposed for the next step
    lora: LoRAAdapter | None = None  # the adapter this sequence runs with (None: the base model)
    grammar: GrammarMatcher | None = None  # structured outputs: where this sequence is in its grammar (llmctl.engine.structured)
    mm_items: list[MultimodalItem] = field(default_factory=list)  # the prompt's images: their positions and hashes
    mrope: MRopePositions | None = None  # M-RoPE models with images: each token's (t, h, w) rotary position
    pooling: PoolingParams | None = None  # a pooling request: prefill only, then its pooled output, no tokens
    pooled: object | None = None  # torch.Tensor: the last stage's pooled output, once its prompt is computed

    @property
    def block_tables(self) -> list[list[int]]:
        """One per KV group, all of the same length (one entry per block of tokens)."""
        return [self.block_table, *self.group_tables]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, position: int) -> int:
        prompt = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < prompt else self.output_token_ids[position - prompt]

    @property
    def prefix_root(self) -> int | None:
        """Where the chain of block hashes starts: K/V computed with an adapter is that adapter's own."""
        return self.lora.cache_salt if self.lora is not None else None

    def block_key(self, index: int, block_size: int) -> tuple[int | str, ...]:
        """What identifies full block `index` in the prefix cache: its token ids, and the hashes of the images
        whose placeholders it holds (the same placeholder ids stand for any image)."""
        start, end = index * block_size, (index + 1) * block_size
        tokens = tuple(self.token_at(p) for p in range(start, end))
        return tokens if not self.mm_items else tokens + block_keys(self.mm_items, start, end)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_token_ids)
