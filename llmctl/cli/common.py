"""Arguments and options several commands share, and parsing of their values."""

from __future__ import annotations

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


def parse_bytes(value: str | None, flag: str) -> int | None:
    """'4GiB', '512MiB', '2e9' or plain bytes."""
    if value is None:
        return None
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
