"""llmctl's own cache folder (built kernels, converted GGUF checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path


def llmctl_cache_dir() -> Path:
    """llmctl's own cache: $LLMCTL_CACHE, else $XDG_CACHE_HOME/llmctl, else ~/.cache/llmctl."""
    if os.environ.get("LLMCTL_CACHE"):
        return Path(os.environ["LLMCTL_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmctl"
