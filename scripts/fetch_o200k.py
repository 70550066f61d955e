"""Fetch OpenAI's o200k_base vocabulary for the gpt-oss tests (tests/server/test_harmony.py), which build a
gpt-oss tokenizer from it: the hub and OpenAI's download are out of reach on CI machines, npm is not. The
`tiktoken` npm package (MIT) carries the same ranks in its own compressed form; they are written back as
o200k_base.tiktoken and checked against tiktoken's published SHA-256, so the file is byte for byte OpenAI's.

    python scripts/fetch_o200k.py        # prints where the file is; fetches it once
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

from llmctl.harmony.vocabulary import VOCAB_SHA256 as SHA256  # tiktoken's published hash, one home

PACKAGE = "https://registry.npmjs.org/tiktoken/-/tiktoken-1.0.22.tgz"
MEMBER = "package/encoders/o200k_base.json"


def vocabulary_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "llmctl" / "test-data" / "o200k_base.tiktoken"


def tiktoken_file(encoder: dict) -> bytes:
    """The npm form — lines of `label first-rank token token …` — as tiktoken's `token rank` lines."""
    ranks: dict[str, int] = {}
    for line in encoder["bpe_ranks"].split("\n"):
        if line:
            _, first, *tokens = line.split(" ")
            ranks.update((token, int(first) + offset) for offset, token in enumerate(tokens))
    return "".join(f"{token} {rank}\n" for token, rank in sorted(ranks.items(), key=lambda item: item[1])).encode()


def main() -> int:
    path = vocabulary_path()
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == SHA256:
        print(path)
        return 0
    with urllib.request.urlopen(PACKAGE, timeout=120) as response:
        archive = tarfile.open(fileobj=io.BytesIO(response.read()), mode="r:gz")
    member = archive.extractfile(MEMBER)
    assert member is not None, f"{PACKAGE} has no {MEMBER}"
    data = tiktoken_file(json.load(member))
    if hashlib.sha256(data).hexdigest() != SHA256:
        print(f"fetch_o200k: {PACKAGE} did not give OpenAI's o200k_base (SHA-256 differs)", file=sys.stderr)
        return 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
