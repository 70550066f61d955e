"""The cost of LoRA: one batch on the base model alone, and spread over 1, 2 and 4 adapters.

`llmctl bench offline`'s code path on the default model (SmolLM2-135M-Instruct, float32), random
prompts, in one script run. The adapter is written here in PEFT's format with random weights
(rank --rank, every projection: q/k/v/o, gate/up/down); as vLLM's benchmark_throughput does,
each request runs one of --max-loras adapter ids read from it. Configurations run --repeat
times, interleaved, and the median is shown with the spread.

    .venv/bin/python benchmarks/lora.py [--num-prompts 32] [--input-len 128] [--output-len 128]
        [--rank 16] [--repeat 2] [--adapters 1 2 4]
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


def write_adapter(folder: Path, rank: int) -> Path:
    """A PEFT LoRA adapter for the default model with random A and B (scale alpha / r = 2)."""
    import torch
    from safetensors.torch import save_file

    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID, resolve_model
    from llmctl.sizing.lora import lora_targets

    spec = load_spec(resolve_model(None, show_progress=False))
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(spec.num_layers):
        for target in lora_targets(spec):
            parent = target.module.split(".")[0]
            for name, out in zip(target.slices, target.slice_outs):
                prefix = f"base_model.model.model.layers.{layer}.{parent}.{name}"
                tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, target.in_features, generator=generator) * 0.02
                tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    names = sorted({n for t in lora_targets(spec) for n in t.slices})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": names,
        "base_model_name_or_path": DEFAULT_MODEL_ID, "bias": "none"}))
    return folder


def run(args: argparse.Namespace, adapter: Path | None, adapters: int) -> OfflineResult:
    dataset = DatasetOptions(name="random", num_prompts=args.num_prompts, random_input_len=args.input_len,
                             random_output_len=args.output_len)
    lora = {"enable_lora": True, "max_loras": adapters, "max_lora_rank": args.rank} if adapter else {}
    return run_offline(OfflineOptions(engine=EngineConfig(**lora), dataset=dataset, temperature=0.0,
                                      lora_path=str(adapter) if adapter else None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        adapter = write_adapter(Path(work) / "adapter", args.rank)
        configs = [("base model", None, 0)] + [(f"{n} adapter{'s' * (n > 1)}", adapter, n) for n in args.adapters]
        runs: dict[str, list[OfflineResult]] = {name: [] for name, _, _ in configs}
        for _ in range(args.repeat):
            for name, path, count in configs:
                runs[name].append(run(args, path, count))
    base = statistics.median(r.llmctl.output_tokens_per_s for r in runs["base model"])
    print(f"{args.num_prompts} requests, {args.input_len} in / {args.output_len} out, greedy, LoRA rank {args.rank}")
    print(f"{'configuration':<14} {'output tok/s (runs)':<28} {'vs base':>8} {'TPOT ms':>8}")
    for name, results in runs.items():
        speeds = [r.llmctl.output_tokens_per_s for r in results]
        tpot = statistics.median(r.tpot.mean for r in results)
        median = statistics.median(speeds)
        spread = ", ".join(f"{s:.1f}" for s in speeds)
        print(f"{name:<14} {median:>7.1f} ({spread}){'':<4} {median / base:>7.2f}x {tpot:>8.1f}")


if __name__ == "__main__":
    main()
