"""How long `llmctl inspect` takes from a shell: the default model cold (GGUF conversion into
an empty cache) and warm (cached), and a hub id answered from the HF cache.

    python benchmarks/inspect_startup.py [--runs 3] [--hub-model bigscience/bloom]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "llmctl", *args], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"llmctl {' '.join(args)} failed: {result.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hub-model", default=None, help="a hub id present in HF_HUB_CACHE")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="llmctl-bench-")
    env = {**os.environ, "LLMCTL_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    cold = timed(["inspect", "--json"], env)
    warm = [timed(["inspect", "--json"], env) for _ in range(args.runs)]
    print(f"default model, cold (GGUF -> safetensors conversion): {cold:.2f} s")
    print(f"default model, warm (cached conversion), median of {args.runs}: {statistics.median(warm):.2f} s")
    if args.hub_model:
        hub = [timed(["inspect", args.hub_model, "--json"], env) for _ in range(args.runs)]
        print(f"{args.hub_model} from the HF cache, median of {args.runs}: {statistics.median(hub):.2f} s")


if __name__ == "__main__":
    main()
