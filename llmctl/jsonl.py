"""JSON Lines input files (calibration text, benchmark prompts), with errors that name the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmctl.errors import LlmctlError


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, record) for every non-empty line."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError:
            raise LlmctlError(f"{path}:{number} is not valid JSON") from None
