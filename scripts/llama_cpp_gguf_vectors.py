"""Record what llama.cpp's own quantizer writes, as test data for llmctl's GGUF writer (tests/quant/test_gguf_export.py).

Needs a llama.cpp build: its libggml-base.so (quantize_row_q4_K_ref, quantize_row_q6_K_ref) and llama-quantize.
Built here from llama-cpp-python 0.3.36's vendored llama.cpp (commit 0c1e570) with
    cmake -B build -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DLLAMA_CURL=OFF && cmake --build build --target llama-quantize
(GGML_NATIVE=OFF: no fused multiply-adds, so blocks do not depend on the CPU that wrote them).

    python scripts/llama_cpp_gguf_vectors.py /path/to/llama.cpp/build/bin

writes tests/fixtures/llama_cpp/k_quant_blocks.json (the K-quant blocks of helpers.gguf_export_model's inputs) and
gguf_tensors.json (each tensor's type and sha256 in the Q4_K_M and Q8_0 files llama-quantize makes from the F32
GGUFs of helpers.gguf_export_model's models: a Llama, an 8-expert Mixtral, a Qwen2-MoE).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
FIXTURES = ROOT / "tests" / "fixtures" / "llama_cpp"
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def k_quant_blocks(library: Path) -> dict[str, dict[str, str]]:
    from helpers.gguf_export_model import k_quant_inputs

    ggml = ctypes.CDLL(str(library))
    blocks: dict[str, dict[str, str]] = {}
    for type_name, block_bytes in BLOCK_BYTES.items():
        quantize = getattr(ggml, f"quantize_row_{type_name.lower().replace('_k', '_K')}_ref")
        blocks[type_name] = {}
        for kind, values in k_quant_inputs().items():
            out = np.zeros(values.size // 256 * block_bytes, np.uint8)
            quantize(values.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                     ctypes.c_int64(values.size))
            blocks[type_name][kind] = out.tobytes().hex()
    return blocks


FILES = {"llama": ("Q4_K_M", "Q8_0"), "mixtral": ("Q4_K_M",), "qwen2_moe": ("Q4_K_M",)}


def quantized_files(llama_quantize: Path) -> dict[str, dict[str, dict[str, list[str]]]]:
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from helpers.gguf_export_model import write_export_model
    from llmctl.checkpoint.source import resolve_model
    from llmctl.quant.gguf_export import export_gguf

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    files: dict[str, dict[str, dict[str, list[str]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family, mixes in FILES.items():
            folder = write_export_model(Path(tmp) / family, tokenizer, family)
            export_gguf(folder, Path(tmp) / f"{family}-f32.gguf", "F32", "export-model")
            files[family] = {}
            for mix in mixes:
                out = Path(tmp) / f"{family}-{mix}.gguf"
                subprocess.run([str(llama_quantize), str(Path(tmp) / f"{family}-f32.gguf"), str(out), mix],
                               check=True, capture_output=True)
                files[family][mix] = {t.name: [t.tensor_type.name, hashlib.sha256(t.data.tobytes()).hexdigest()]
                                      for t in GGUFReader(str(out)).tensors}
    return files


def main() -> None:
    bin_dir = Path(sys.argv[1])
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / "k_quant_blocks.json").write_text(json.dumps(k_quant_blocks(bin_dir / "libggml-base.so"), indent=0))
    (FIXTURES / "gguf_tensors.json").write_text(json.dumps(quantized_files(bin_dir / "llama-quantize"), indent=1))


if __name__ == "__main__":
    main()
