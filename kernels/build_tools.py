"""What building the C++ CPU kernels needs, checked without building anything and without torch (so
`llmctl inspect` can say which attention backend a machine would run while staying light)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def missing_tools() -> str | None:
    """What a build would lack (a compiler, ninja), or None; cheap: nothing is built."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (install g++, e.g. apt install g++)"
    if shutil.which("ninja") is None and not (Path(sys.executable).parent / "ninja").exists():
        return "ninja is not installed (pip install ninja)"
    return None
