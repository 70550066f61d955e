"""vLLM's `bad_words`: each word as token ids (alone and after a space, since tokenizers spell a word
differently at the start of a text and inside it), and per step the last token of any word whose
other tokens the output just produced — that token is then blocked."""

from __future__ import annotations

from typing import Any


def bad_words_token_ids(words: list[str], tokenizer: Any) -> list[list[int]]:
    """vLLM's SamplingParams.update_from_tokenizer: the word, and ' word' where it tokenizes to as many
    tokens starting with a different one."""
    sequences: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        sequences.append(bare)
        if spaced and bare and spaced[0] != bare[0] and len(spaced) == len(bare):
            sequences.append(spaced)
    return [ids for ids in sequences if ids]


def blocked_by_bad_words(sequences: list[list[int]], output_token_ids: list[int]) -> list[int]:
    """The tokens that would complete a bad word now (single-token words always)."""
    blocked = []
    for ids in sequences:
        prefix = ids[:-1]
        if len(prefix) <= len(output_token_ids) and (not prefix or output_token_ids[-len(prefix):] == prefix):
            blocked.append(ids[-1])
    return blocked
