"""Rewrite pyproject.toml's list of modules mypy skips to those that fail today (run after typing some):
mypy runs once with nothing skipped, and the failing modules become the list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = re.compile(r"(\[\[tool\.mypy\.overrides\]\]\nmodule = \[\n)(.*?)(\]\nignore_errors = true)", re.S)


def failing_modules() -> list[str]:
    pyproject = ROOT / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(LIST.sub(r"\1\3", text))  # an empty list: every module checked
    try:
        out = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True).stdout
    finally:
        pyproject.write_text(text)
    files = {line.split(":")[0] for line in out.splitlines() if ": error:" in line}
    return sorted(f.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for f in files)


if __name__ == "__main__":
    modules = failing_modules()
    pyproject = ROOT / "pyproject.toml"
    body = "".join(f'    "{m}",\n' for m in modules)
    text = LIST.sub(lambda m: m.group(1) + body + m.group(3), pyproject.read_text())
    text = re.sub(r"The modules below do not pass yet \(\d+ of", f"The modules below do not pass yet ({len(modules)} of", text)
    pyproject.write_text(text)
    print(f"{len(modules)} modules still skipped")
