"""Acceptance counters under vLLM's names (spec_decode_num_drafts, …_num_draft_tokens,
…_num_accepted_tokens, …_num_accepted_tokens_per_pos)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeStats:
    num_speculative_tokens: int
    num_drafts: int = 0  # sequences × steps that verified a proposal
    num_draft_tokens: int = 0  # proposed tokens verified
    num_accepted_tokens: int = 0  # of those, accepted (the bonus token is not counted)
    accepted_per_position: list[int] = field(default_factory=list)  # accepted at draft position 0, 1, …

    def __post_init__(self) -> None:
        self.accepted_per_position = [0] * self.num_speculative_tokens

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verified step (1 + accepted per draft), as vLLM's benchmark prints it."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None
