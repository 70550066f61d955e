"""Sleep mode (--enable-sleep-mode) on a model in this process: resident memory before and after each level, the
seconds to sleep and to wake, and whether the greedy tokens after waking are those of before.

    python benchmarks/sleep_mode.py                      # the default model's safetensors folder, a 512 MiB KV pool
    python benchmarks/sleep_mode.py --model DIR --kv-cache-mib 1024

Resident memory is /proc/self/statm's: on CPUs both levels hand pages back to the OS (llmctl.engine.worker.sleep)."""

from __future__ import annotations

import argparse
import mmap
import time
from pathlib import Path

from llmctl import LLM, SamplingParams
from llmctl.checkpoint.source import resolve_model

MiB = 2**20
PROMPT = "The capital of France is"


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model folder (default: the default model's, unquantized)")
    parser.add_argument("--kv-cache-mib", type=int, default=512)
    args = parser.parse_args()
    model = args.model or str(resolve_model(None, show_progress=False).path)
    llm = LLM(model, max_model_len=2048, kv_cache_memory=args.kv_cache_mib * MiB, enable_sleep_mode=True)
    loaded = llm.engine.loaded
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = llm.generate([PROMPT], params)[0].outputs[0].token_ids
    print(f"{model}: weights {loaded.weights_bytes / MiB:.0f} MiB (+ packed {loaded.packed_bytes / MiB:.0f} MiB), "
          f"KV pool {loaded.kv_cache_bytes / MiB:.0f} MiB")
    for level in (1, 2):
        before, started = resident_bytes(), time.perf_counter()
        llm.sleep(level)
        slept, asleep = time.perf_counter(), resident_bytes()
        llm.wake_up()
        woke = time.perf_counter()
        same = llm.generate([PROMPT], params)[0].outputs[0].token_ids == expected
        print(f"level {level}: resident {before / MiB:,.0f} -> {asleep / MiB:,.0f} MiB "
              f"({(before - asleep) / MiB:,.0f} MiB given back); sleep {slept - started:.2f} s, "
              f"wake {woke - slept:.2f} s; the same tokens after waking: {same}")


if __name__ == "__main__":
    main()
