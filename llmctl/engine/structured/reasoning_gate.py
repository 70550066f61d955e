"""A grammar that starts when the reasoning ends: with --reasoning-parser, a request's structured
output constrains the answer only (vLLM's StructuredOutputManager waits for is_reasoning_end). Until
the reasoning's end marker has been generated every token is allowed and nothing reaches the grammar;
rollbacks (speculative decoding) may cross the marker in either direction."""

from __future__ import annotations

import torch

from llmctl.engine.structured.matcher import GrammarMatcher


class ReasoningGate:
    def __init__(self, grammar: GrammarMatcher, end_ids: tuple[int, ...]) -> None:
        self.grammar, self.end_ids = grammar, end_ids
        self.thinking: list[int] = []  # tokens accepted before the end marker, the marker's included
        self.answered = 0  # tokens the grammar accepted since

    @property
    def reasoning_ended(self) -> bool:
        return tuple(self.thinking[-len(self.end_ids):]) == self.end_ids

    @property
    def is_terminated(self) -> bool:
        return self.reasoning_ended and self.grammar.is_terminated

    def fresh(self) -> ReasoningGate:
        return ReasoningGate(self.grammar.fresh(), self.end_ids)

    def accept(self, token: int) -> bool:
        if not self.reasoning_ended:
            self.thinking.append(token)
            return True
        if not self.grammar.accept(token):
            return False
        self.answered += 1
        return True

    def rollback(self, count: int) -> None:
        undone = min(count, self.answered)
        if undone:
            self.grammar.rollback(undone)
            self.answered -= undone
        if count > undone:
            del self.thinking[len(self.thinking) - (count - undone):]

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.reasoning_ended:
            self.grammar.fill_bitmask(bitmask, row)
        else:
            bitmask[row].fill_(-1)


def prompt_ends_reasoning(prompt: list[int], start_ids: tuple[int, ...], end_ids: tuple[int, ...]) -> bool:
    """Whether the prompt's last reasoning marker is the end one (vLLM's is_reasoning_end on the prompt): a
    template that turns thinking off closes an empty block in the prompt, so the answer starts at once."""
    for end in range(len(prompt), 0, -1):
        if start_ids and tuple(prompt[max(0, end - len(start_ids)):end]) == start_ids:
            return False
        if tuple(prompt[max(0, end - len(end_ids)):end]) == end_ids:
            return True
    return False
