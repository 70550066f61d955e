"""Speculative decoding on and off, offline (`llmctl bench offline`'s code path), in one script run.

Two workloads on the default model (SmolLM2-135M-Instruct, float32):
- lookup: "repeat this text" prompts built from WikiText-2 test paragraphs (tests/fixtures/data),
  where prompt lookup finds what comes next;
- random: random-token prompts (`bench offline`'s random dataset), where it finds little.

Methods: none, n-gram (k = 4, suffixes of 2-4 tokens), and with --draft also the model as its own
draft (every proposal accepted: the overhead floor) and a random 2-layer draft of the same tokenizer
(almost nothing accepted). Each configuration runs --repeat times, interleaved, and the median is shown.

    .venv/bin/python benchmarks/spec_decode.py [--num-prompts 16] [--output-len 128] [--repeat 2]
        [--temperature 0] [--max-num-seqs 16] [--draft] [--disable-by-batch-size N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from llmctl.bench.datasets import DatasetOptions
from llmctl.bench.offline import OfflineOptions, OfflineResult, run_offline
from llmctl.engine.config import EngineConfig

WIKITEXT = Path(__file__).parents[1] / "tests/fixtures/data/wikitext-2-raw-test.hfdatasets-derived.crlf.txt"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def lookup_prompts(path: Path, count: int, output_len: int) -> Path:
    """JSONL of prompts that ask for a paragraph back, as `bench offline --dataset-name custom` reads it."""
    paragraphs = [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines()
                  if 400 < len(line.strip()) < 900 and not line.strip().startswith("=")]
    with path.open("w") as out:
        for paragraph in paragraphs[:count]:
            prompt = f"Text: {paragraph}\n\nThe same text, copied word for word:\n{paragraph[:40]}"
            out.write(json.dumps({"prompt": prompt, "output_tokens": output_len}) + "\n")
    return path


def random_draft(folder: Path) -> Path:
    """A 2-layer Llama with random weights and the default model's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    from llmctl.checkpoint.source import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(None, show_progress=False).path))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(dataset: DatasetOptions, temperature: float, max_num_seqs: int, speculative: dict | None) -> OfflineResult:
    engine = EngineConfig(max_num_seqs=max_num_seqs, speculative_config=speculative)
    return run_offline(OfflineOptions(engine=engine, dataset=dataset, temperature=temperature))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-num-seqs", type=int, default=16,
                        help="sequences decoding together (1: each request alone, the latency case)")
    parser.add_argument("--draft", action="store_true", help="also the draft-model runs")
    parser.add_argument("--disable-by-batch-size", type=int, default=None, metavar="N",
                        help="also n-gram with vLLM's disable_by_batch_size N")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmctl-spec-") as folder:
        compare(args, Path(folder))


def compare(args: argparse.Namespace, work: Path) -> None:
    workloads = {
        "lookup": DatasetOptions(name="custom", path=(lookup_prompts(work / "lookup.jsonl", args.num_prompts,
                                                                       args.output_len)),
                                 num_prompts=args.num_prompts),
        "random": DatasetOptions(name="random", num_prompts=args.num_prompts, random_input_len=256,
                                 random_output_len=args.output_len),
    }
    methods: dict[str, dict | None] = {"none": None, "ngram k=4": NGRAM}
    if args.disable_by_batch_size:
        methods[f"ngram, off at {args.disable_by_batch_size}"] = {**NGRAM, "disable_by_batch_size":
                                                                 args.disable_by_batch_size}
    if args.draft:
        from llmctl.checkpoint.source import resolve_model

        itself = str(resolve_model(None, show_progress=False).path)
        methods["draft: itself k=3"] = {"model": itself, "num_speculative_tokens": 3}
        methods["draft: random k=3"] = {"model": str(random_draft(work / "random-draft")),
                                        "num_speculative_tokens": 3}
    print(f"{'workload':<8} {'method':<18} {'output tok/s (runs)':<22} {'median':>7} {'vs none':>8} "
          f"{'TPOT ms':>8} {'accept':>7} {'mean len':>9}", flush=True)
    for name, dataset in workloads.items():
        results: dict[str, list[OfflineResult]] = {method: [] for method in methods}
        for _ in range(args.repeat):
            for method, speculative in methods.items():
                results[method].append(run(dataset, args.temperature, args.max_num_seqs, speculative))
        base = statistics.median(r.llmctl.output_tokens_per_s for r in results["none"])
        for method, runs in results.items():
            rates = [r.llmctl.output_tokens_per_s for r in runs]
            median = statistics.median(rates)
            tpot = statistics.median(r.tpot.median for r in runs)
            spec = runs[-1].spec_decode
            accept = f"{spec.acceptance_rate:.0%}" if spec and spec.acceptance_rate is not None else "-"
            length = f"{spec.mean_acceptance_length:.2f}" if spec and spec.mean_acceptance_length else "-"
            print(f"{name:<8} {method:<18} {' '.join(f'{r:6.1f}' for r in rates):<22} {median:7.1f} "
                  f"{median / base:7.2f}x {tpot:8.1f} {accept:>7} {length:>9}", flush=True)


if __name__ == "__main__":
    main()
