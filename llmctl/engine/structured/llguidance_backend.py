"""llguidance (vLLM's `guidance` backend): the same request forms compiled by llguidance — JSON schemas,
regexes, choices, and grammars in Lark or GBNF — with one LLMatcher per sequence."""

from __future__ import annotations

import json
from typing import Any

import torch

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.structured.params import StructuredOutputsParams


class LLGuidanceMatcher:
    """One sequence's position in its grammar (llmctl.engine.structured.matcher.GrammarMatcher). Like
    vLLM's guidance backend it counts as terminated once the stop token came: a complete grammar
    (llguidance's is_stopped) still masks everything but that token."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        import llguidance

        self._tokenizer, self._grammar = tokenizer, grammar
        self._matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self._consumed: list[bool] = []  # per accepted token: did llguidance consume it (not once stopped)
        self._terminated_at: int | None = None  # how many tokens were accepted when the stop token came

    def fresh(self) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._tokenizer, self._grammar)

    @property
    def is_terminated(self) -> bool:
        return self._terminated_at is not None

    def accept(self, token: int) -> bool:
        """A refused token leaves the matcher as it was (llguidance would enter an error state)."""
        stopped = self._matcher.is_stopped()
        if not stopped and self._matcher.validate_tokens([token]) != 1:
            return False
        if not stopped:
            self._matcher.consume_token(token)
        self._consumed.append(not stopped)
        if token == self._tokenizer.eos_token and self._terminated_at is None:
            self._terminated_at = len(self._consumed)
        return True

    def rollback(self, count: int) -> None:
        """Undo the last `count` accepted tokens (speculative decoding's walk through a draft)."""
        if not count:
            return
        undone, self._consumed = self._consumed[-count:], self._consumed[:-count]
        if sum(undone):
            self._matcher.rollback(sum(undone))
        if self._terminated_at is not None and self._terminated_at > len(self._consumed):
            self._terminated_at = None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, row)


class LLGuidanceBackend:
    name = "guidance"

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        import llguidance.hf

        self.vocab_size = vocab_size
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                       eos_token=eos_token_ids[0] if eos_token_ids else None)

    def compile(self, params: StructuredOutputsParams) -> LLGuidanceMatcher:
        import llguidance

        try:
            grammar = self._grammar(params)
            error = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer)
        except (ValueError, TypeError, RuntimeError) as exc:
            error = str(exc)
        if error:
            first = error.strip().splitlines()[0] if error.strip() else error
            raise InvalidRequestError(f"the {params.kind} of structured outputs cannot be compiled (guidance): "
                                      f"{first}", "structured_outputs")
        return LLGuidanceMatcher(self._tokenizer, grammar)

    @staticmethod
    def _grammar(params: StructuredOutputsParams) -> str:
        import llguidance

        defaults = {"whitespace_flexible": not params.disable_any_whitespace}
        kind = params.kind
        if kind in ("json", "json_object"):
            schema = params.json if kind == "json" else {"type": "object"}
            text = schema if isinstance(schema, str) else json.dumps(schema)
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=defaults)
        if kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(params.choice)))
        if kind in ("regex", "grammar"):
            return llguidance.grammar_from(kind, getattr(params, kind))
        return _structural_tag_grammar(params.structural_tag)


def _structural_tag_grammar(text: str) -> str:
    """vLLM's guidance form of a structural tag: each structure's begin/schema/end behind the trigger it
    starts with, as llguidance's StructTag grammar (free text elsewhere)."""
    import llguidance

    tag = json.loads(text)
    if not isinstance(tag, dict) or "structures" not in tag or "triggers" not in tag:
        raise InvalidRequestError("under the guidance backend a structural_tag takes vLLM's form {\"structures\": "
                                  "[{\"begin\", \"schema\", \"end\"}], \"triggers\": [...]}; xgrammar's newer "
                                  "format needs the xgrammar backend", "structured_outputs")
    tags = []
    for structure in tag["structures"]:
        trigger = next((t for t in tag["triggers"] if structure["begin"].startswith(t)), None)
        if trigger is None:
            raise InvalidRequestError(f"structural_tag: no trigger begins {structure['begin']!r}", "structured_outputs")
        tags.append(llguidance.StructTag(trigger=trigger, begin=structure["begin"], grammar=structure["schema"],
                                         end=structure["end"]))
    if not tags:
        raise InvalidRequestError("structural_tag has no structures", "structured_outputs")
    return llguidance.StructTag.to_grammar(tags)
