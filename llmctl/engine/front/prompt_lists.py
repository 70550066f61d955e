"""The prompt lists LLM's calls take: one prompt or many, one parameter set or one per prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def per_prompt(value: Any, count: int, what: str) -> list[Any]:
    """One value for every prompt, or a list with one per prompt."""
    if value is None or not isinstance(value, (list, tuple)):
        return [value] * count
    if len(value) != count:
        raise ValueError(f"{len(value)} {what} for {count} prompts")
    return list(value)


def text_prompts(prompts: str | list[int] | Sequence[str | list[int]]) -> list[str | list[int]]:
    single = isinstance(prompts, str) or is_token_ids(prompts)
    return [prompts] if single else list(prompts)  # type: ignore[list-item,arg-type]


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)
