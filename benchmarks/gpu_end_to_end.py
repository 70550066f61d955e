"""End to end on a GPU: `llmctl bench offline` on a random-weight model with Llama-3-8B's shapes in
bfloat16, with CUDA graphs on and off (and, with --compare, transformers `generate` beside each).

    python benchmarks/gpu_end_to_end.py [--num-prompts 64] [--input-len 512] [--output-len 128] [--json FILE]
    python benchmarks/gpu_end_to_end.py --tiny    # a small model on any machine: checks the script runs

No weights can be downloaded on the lent machines, and shapes are what sets the speed: the
model is built from the config with random weights and saved once (16 GB) in --workdir.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

LLAMA_3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=49152, max_position_embeddings=2048)


def make_model(folder: Path, shapes: dict, dtype: str) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from llmctl.checkpoint.source import resolve_model

    if (folder / "config.json").exists():
        return folder
    config = LlamaConfig(**shapes, dtype=dtype, tie_word_embeddings=False)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # 8B random weights: seconds on a GPU
        model = LlamaForCausalLM._from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    del model
    # the default model's tokenizer: its ids are all below either vocabulary size
    AutoTokenizer.from_pretrained(str(resolve_model(None).path)).save_pretrained(folder)
    return folder


def bench(folder: Path, args: argparse.Namespace, *flags: str) -> dict:
    command = [sys.executable, "-m", "llmctl", "bench", "offline", str(folder), "--num-prompts", str(args.num_prompts),
               "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
               "--max-model-len", str(args.input_len + args.output_len), "--json", *flags]
    if args.compare:  # transformers generate on the engine's device and dtype
        command += ["--compare", "transformers"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llmctl-gpu-bench"))
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--compare", action="store_true", help="also run transformers generate")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    if args.tiny:
        args.num_prompts, args.input_len, args.output_len = 4, 16, 8
    name = "tiny-llama" if args.tiny else "random-llama-3-8b"
    folder = make_model(args.workdir / name, TINY if args.tiny else LLAMA_3_8B, "float32" if args.tiny else "bfloat16")
    figures = {}
    for label, flags in (("default", ()), ("--enforce-eager", ("--enforce-eager",))):  # graphs on / off on CUDA
        report = figures[label] = bench(folder, args, *flags)
        ours, theirs = report["llmctl"], report.get("transformers") or {}
        print(f"{label:>16}: llmctl {ours['output_tokens_per_s']:9.1f} output tok/s, transformers generate "
              f"{theirs.get('output_tokens_per_s', float('nan')):9.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
