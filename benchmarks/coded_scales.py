"""Coded GGUF weights with float16 scales and offsets (what the engine keeps where exact) against the same
weights with float32 ones: one process, the default model, single-stream decode of 128 greedy tokens (the
time of 128 less the time of 1), the two alternating, median of 5.

    python benchmarks/coded_scales.py
"""

from __future__ import annotations

import statistics
import time

import torch

from llmctl import LLM, SamplingParams
from llmctl.engine.layers.coded_linear import CodedWeight


def main() -> None:
    llm = LLM(None, kv_cache_memory=64 * 1024**2, max_model_len=1024, enable_prefix_caching=False)
    model = llm.engine.executor.loaded.model
    holders = [m for m in model.modules() if isinstance(getattr(m, "coded", None), CodedWeight)]
    half = {id(m): m.coded for m in holders}
    full = {id(m): CodedWeight(m.coded.codes, m.coded.scales.float(), m.coded.offsets.float()) for m in holders}
    halves = sum(m.coded.scales.dtype == torch.float16 for m in holders)
    mib = [sum(w.nbytes for w in table.values()) / 2**20 for table in (half, full)]
    print(f"{halves} of {len(holders)} coded weights hold float16 scales: {mib[0]:.1f} MiB ({mib[1]:.1f} MiB with "
          "float32 ones)")
    prompt = [1000 + (i * 7919) % 20000 for i in range(16)]

    def decode(n: int) -> float:
        start = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        return time.perf_counter() - start

    results = {"float16": [], "float32": []}
    for _ in range(5):
        for name, table in (("float16", half), ("float32", full)):
            for m in holders:
                m.coded = table[id(m)]
            decode(4)
            results[name].append(127 / (decode(128) - decode(1)))
    for name, values in results.items():
        print(f"{name} scales: decode {statistics.median(values):.1f} tok/s (runs {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
