"""Calibration and evaluation text: a .txt or .jsonl file, tokenized into fixed-length samples."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from llmctl.errors import LlmctlError
from llmctl.jsonl import read_jsonl

JSONL_TEXT_KEYS = ("text", "content", "prompt")


def read_texts(path: Path) -> list[str]:
    if not path.exists():
        raise LlmctlError(f"calibration file {path} does not exist")
    if path.suffix == ".jsonl":
        texts = []
        for number, record in read_jsonl(path):
            text = next((record[k] for k in JSONL_TEXT_KEYS if isinstance(record, dict) and
                         isinstance(record.get(k), str)), None)
            if text is None:
                raise LlmctlError(f"{path}:{number} has no text field ({', '.join(JSONL_TEXT_KEYS)})")
            texts.append(text)
        return texts
    return [path.read_text(encoding="utf-8", errors="replace")]


def token_stream(tokenizer: Any, texts: list[str]) -> list[int]:
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text.replace("\r\n", "\n"), add_special_tokens=False)
    return ids


def calibration_samples(tokenizer: Any, path: Path, samples: int, seq_len: int, seed: int = 0,
                        skip_tail: int = 0) -> torch.Tensor:
    """[samples, seq_len] windows drawn at random from the file's token stream.

    `skip_tail` tokens at the end are never used (they are kept for evaluation)."""
    ids = token_stream(tokenizer, read_texts(path))
    if skip_tail:
        ids = ids[:-skip_tail]
    if len(ids) < seq_len + 1:
        raise LlmctlError(f"{path} has {len(ids)} tokens; --calib-seq-len {seq_len} needs more text")
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(ids) - seq_len) for _ in range(samples)]
    return torch.tensor([ids[s:s + seq_len] for s in starts], dtype=torch.long)
