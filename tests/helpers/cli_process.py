"""The real `llmctl` entry point, run as a user runs it: in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `python -m llmctl ARGS` in a subprocess (wide columns, so tables do not wrap)."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=cwd)
