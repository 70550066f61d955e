"""Arguments and options several commands share, and parsing of their values."""

from __future__ import annotations

import re
from typing import Annotated, Optional

import typer

from llmctl.errors import LlmctlError

ModelArg = Annotated[
    Optional[str],
    typer.Argument(help="hub id (org/name), local model directory, .gguf file; omitted: the default model "
                        "(SmolLM2-135M-Instruct)", show_default=False),
]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="hub branch, tag or commit")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]


def _human_readable_int(value: str) -> int | None:
    """vLLM's human_readable_int: '32k' is 32,000 (lower case: powers of 1000), '32K' 32,768 (of 1024)."""
    vllm_form = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
    if vllm_form is None:
        return None
    number, letter = vllm_form.groups()
    power = "kmgt".index(letter.lower()) + 1
    return int(float(number) * (1000 if letter.islower() else 1024) ** power)


def parse_count(value: str | None, flag: str) -> int | None:
    """A count as vLLM's flags take it: '32768', '32k' or '32K'."""
    if value is None:
        return None
    counted = _human_readable_int(value)
    if counted is not None:
        return counted
    try:
        return int(value)
    except ValueError:
        raise LlmctlError(f"{flag} {value!r} is not a whole number: e.g. 32768, 32k (32,000) or 32K "
                          "(32,768)") from None


def parse_bytes(value: str | None, flag: str) -> int | None:
    """'4GiB', '512MiB', '2e9', plain bytes, or vLLM's human-readable ints: '4G' (binary), '4g' (decimal)."""
    if value is None:
        return None
    counted = _human_readable_int(value)
    if counted is not None:
        return counted
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "b": 1}
    text = value.strip().lower()
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(float(text))
    except ValueError:
        raise LlmctlError(f"{flag} {value!r} is not a size: use bytes or a unit, e.g. 4GiB") from None
