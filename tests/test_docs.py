"""What README.md and docs/ quote is true of the tree: every `tests/…`, `benchmarks/…`, `scripts/…`,
`docs/…` path and relative link exists, and every `llmctl …` command line (in shell blocks and in inline code)
parses through the real CLI's parser (docs/serve.md once named a test file that did not exist)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from helpers.command_line import parse_line

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"(?<![\w/.-])((?:tests|benchmarks|scripts|docs|kernels|llmctl|docker|templates)/[\w./-]*\w)"
                  r"(?![\w./*-])")  # a glob (kernels/cpu_*.cpp) is not a path
LINK = re.compile(r"\]\(([^)#:]+)(?:#[^)]*)?\)")
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)
INLINE = re.compile(r"`(llmctl [^`]+)`")
PLACEHOLDER = re.compile(r"[\[\]|…<>{}]|\.\.\.|\bN\b|\bTYPE\b|\bCMD\b")


def quoted_paths(page: Path) -> list[str]:
    text = page.read_text()
    found = {m.group(1) for m in PATH.finditer(text)}
    found |= {str((page.parent / m.group(1)).resolve().relative_to(ROOT)) for m in LINK.finditer(text)
              if not m.group(1).startswith(("http", "mailto"))}
    return sorted(found)


def command_lines(page: Path) -> list[str]:
    text = page.read_text()
    lines = []
    for block in SHELL_BLOCK.findall(text):
        joined = block.replace("\\\n", " ")
        lines += [line.strip() for line in joined.splitlines() if line.strip().startswith("llmctl ")]
    lines += [span for span in INLINE.findall(text) if not PLACEHOLDER.search(span)]
    return [shlex.join(shlex.split(line, comments=True)) for line in lines]


def test_every_quoted_path_exists() -> None:
    missing = [f"{page.relative_to(ROOT)}: {path}" for page in PAGES for path in quoted_paths(page)
               if not (ROOT / path).exists()]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_command_line_parses(page: Path) -> None:
    bad = []
    for line in command_lines(page):
        try:
            parse_line(line)
        except (click.exceptions.ClickException, click.exceptions.Exit, SystemExit, IndexError, AssertionError) as exc:
            bad.append(f"{line}: {type(exc).__name__} {exc}")
    assert bad == []


def test_no_readme_table_cell_over_300_characters() -> None:
    cells = [cell.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("|")
             for cell in line.strip("|").split(" | ")]
    assert cells and max(len(cell) for cell in cells) <= 300, max(cells, key=len)


def test_architecture_names_every_module_in_its_room() -> None:
    """docs/architecture.md's module list is scripts/architecture_rooms.py's output for today's tree."""
    import runpy

    rooms = runpy.run_path(str(ROOT / "scripts" / "architecture_rooms.py"))
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert rooms["page_block"](page) == rooms["rooms"](), "run: python scripts/architecture_rooms.py --write"
