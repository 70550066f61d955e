"""One GPU decode workload counted, not guessed (issue 60): TPOT beside its memory-bandwidth floor, the kernels
launched per decode step, and each step's host time against its device time.

    python benchmarks/gpu_step_profile.py [--num-prompts 64] [--input-len 512] [--output-len 128] [--json FILE]
    python benchmarks/gpu_step_profile.py --async-scheduling     # the same with vLLM's --async-scheduling
    python benchmarks/gpu_step_profile.py --tiny                 # a small model on any machine: checks the script

1. copy bandwidth: a 2 GiB device-to-device copy, bytes read + written per second (the floor's rate);
2. TPOT: `LLM.generate` on a random-weight model with Llama-3-8B's shapes in bfloat16 (built once in --workdir,
   as benchmarks/gpu_end_to_end.py builds it), random prompt ids, ignore_eos; median over requests of
   (last token − first token) / (tokens − 1);
3. the floor: (weights + the KV a mid-generation step reads: every sequence's prompt and half its output) ÷
   the copy bandwidth, and TPOT ÷ floor;
4. a profile of a few pure decode steps (torch.profiler): kernels per step, the device's busy time per step
   (its kernels' summed durations) and the step's wall time — where they differ, the GPU waited for the host.

The JSON is written after each part, so a device call cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from gpu_end_to_end import LLAMA_3_8B, TINY, make_model

PROFILED_STEPS = 5


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes read plus written per second by a device-to-device copy (the median of 5)."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(6):
        _synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / statistics.median(times[1:])


def _synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def tpot(llm, prompts: list[list[int]], output_len: int) -> dict:
    from llmctl import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    per_request = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
                   for o in outputs if len(o.outputs[0].token_ids) > 1]
    return {"tpot_ms": statistics.median(per_request) * 1e3, "output_tokens_per_s": len(prompts) * output_len / elapsed}


def floor_ms(llm, num_prompts: int, input_len: int, output_len: int, bandwidth: float) -> dict:
    """(weights + a mid-generation step's KV reads) ÷ copy bandwidth."""
    loaded = llm.engine.executor.loaded
    spec, kv_dtype = loaded.spec, loaded.kv_caches[next(iter(loaded.kv_caches))].kv.dtype
    att = spec.attention
    kv_per_token = 2 * spec.num_layers * att.num_kv_heads * att.head_dim * kv_dtype.itemsize
    kv_bytes = num_prompts * (input_len + output_len // 2) * kv_per_token
    return {"weights_bytes": loaded.weights_bytes, "kv_bytes_read": kv_bytes,
            "floor_ms": (loaded.weights_bytes + kv_bytes) / bandwidth * 1e3}


def profile_decode_steps(llm, prompts: list[list[int]], output_len: int, device: str) -> dict:
    """Kernels, device busy time and wall time of PROFILED_STEPS steps once every prompt is decoding."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from llmctl import SamplingParams

    engine = llm.engine
    for index, prompt in enumerate(prompts):
        engine.add_request(f"profiled-{index}", prompt, SamplingParams(temperature=0, max_tokens=output_len,
                                                                        ignore_eos=True))
    while any(seq.in_prefill for seq in engine.scheduler.running + list(engine.scheduler.waiting)):
        engine.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    _synchronize(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            engine.step()
        _synchronize(device)
    wall = (time.perf_counter() - start) / PROFILED_STEPS
    for index in range(len(prompts)):
        engine.abort(f"profiled-{index}")
    if device != "cuda":  # no kernels to count: the step's wall time only
        return {"wall_ms_per_step": wall * 1e3}
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e6 / PROFILED_STEPS  # µs → s
    return {"kernels_per_step": len(kernels) / PROFILED_STEPS, "device_busy_ms_per_step": busy * 1e3,
            "wall_ms_per_step": wall * 1e3, "device_busy_share": busy / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llmctl-gpu-bench"))
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here (after every part)")
    args = parser.parse_args()
    import torch

    from llmctl import LLM

    if args.tiny:
        args.num_prompts, args.input_len, args.output_len = 4, 16, 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    figures: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                     "workload": f"{args.num_prompts} x {args.input_len} -> {args.output_len}",
                     "async_scheduling": args.async_scheduling}

    def record(**found: object) -> None:
        figures.update(found)
        print(json.dumps(found), flush=True)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))

    bandwidth = copy_bandwidth(device, (256 << 20) if args.tiny else (2 << 30))
    record(copy_bandwidth_gb_s=bandwidth / 1e9)
    name = "tiny-llama" if args.tiny else "random-llama-3-8b"
    folder = make_model(args.workdir / name, TINY if args.tiny else LLAMA_3_8B, "float32" if args.tiny else "bfloat16")
    llm = LLM(str(folder), max_model_len=args.input_len + args.output_len, async_scheduling=args.async_scheduling)
    rng = random.Random(0)
    prompts = [[rng.randint(100, 40000) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    floor = floor_ms(llm, args.num_prompts, args.input_len, args.output_len, bandwidth)
    record(**floor)
    measured = tpot(llm, prompts, args.output_len)
    record(**measured, tpot_over_floor=measured["tpot_ms"] / floor["floor_ms"])
    record(**profile_decode_steps(llm, prompts, args.output_len, device))
    llm.shutdown()


if __name__ == "__main__":
    main()
