"""Single-stream decode of compressed-tensors checkpoints on this CPU, against the float32 model they came from.

Issue 61's measure: the default model's shape (SmolLM2-135M: 30 layers, 576 wide, 9 heads of 64 over 3 KV
heads, a 1,536-wide MLP, the 49,152-token vocabulary; random weights), quantized by the compressed-tensors
library (tests/helpers/compressed.py): W4A16 and W8A16 in groups of 64 (576 is not a multiple of 128), W8A8
per channel. One request of 16 prompt tokens, 128 greedy tokens; tokens per second = 127 / (time for 128 −
time for 1), each the median of --repeat calls in one warm process. Every model runs in a fresh process,
alternating, --rounds times, so the machine's noise spreads over all of them.

    .venv/bin/python benchmarks/quantized_decode.py [--rounds 3] [--json results.json]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from alternating import alternate, decode_tokens_per_second, median_ratios, rounds_parser, worker_figure

PROMPT = [100 + 37 * i for i in range(16)]
OUTPUT_TOKENS = 128
SCHEMES = {"W4A16": 64, "W8A16": 64, "W8A8": None}  # preset: group size (None: the preset's own, per channel)


def build(folder: Path) -> dict[str, Path]:
    """The float32 model and its compressed-tensors checkpoints (built once, reused)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import torch
    import transformers

    from helpers.compressed import compressed_checkpoint
    from llmctl.checkpoint.source import resolve_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    base = folder / "float32"
    if not (base / "config.json").exists():
        config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                          num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                          max_position_embeddings=2048, tie_word_embeddings=True)
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).save_pretrained(base)
        tokenizer.save_pretrained(base)
    models = {"float32": base}
    for preset, group in SCHEMES.items():
        models[preset] = folder / preset
        if not (folder / preset / "config.json").exists():
            compressed_checkpoint(base, preset, folder / preset, tokenizer, group_size=group)
    return models


def worker(folder: str, repeat: int) -> None:
    from llmctl import LLM

    llm = LLM(folder, max_model_len=512)
    print(json.dumps({"tok_s": decode_tokens_per_second(llm, PROMPT, OUTPUT_TOKENS, repeat)}))


def main() -> None:
    parser = rounds_parser(__doc__.splitlines()[0], "/tmp/llmctl-quantized-decode")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.repeat)
        return
    models = build(args.dir)
    env = {**os.environ}
    command = [sys.executable, __file__, "--repeat", str(args.repeat), "--worker"]
    figures = alternate(list(models), args.rounds,
                        lambda name: worker_figure(command + [str(models[name])], env, "tok_s", name))
    print(f"single-stream decode, {OUTPUT_TOKENS} tokens, the default model's shape (tokens/s, median of "
          f"{args.rounds} rounds):")
    for name, (median, ratio) in median_ratios(figures, "float32").items():
        print(f"  {name:8s} {median:7.1f}  {ratio:.2f}× float32")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
