"""Offline throughput: the same random-token workload through llmctl and transformers.

    python benchmarks/offline_throughput.py                  # 64 requests, lengths 32-256
    python benchmarks/offline_throughput.py --num-prompts 16 --skip-transformers

Every request gets a random-token prompt and a fixed output length (ignore_eos,
temperature 0.6). transformers runs `generate` on padded batches in arrival order, each
batch until its longest requested output; only the requested tokens count as output.
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def workload(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], int]]:
    rng = random.Random(args.seed)
    return [([rng.randrange(100, vocab - 100) for _ in range(rng.randint(args.min_len, args.max_len))],
             rng.randint(args.min_len, args.max_len)) for _ in range(args.num_prompts)]


def run_llmctl(args: argparse.Namespace) -> tuple[float, int, int, object]:
    from llmctl import LLM, SamplingParams

    llm = LLM(args.model, max_model_len=1024, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens)
    requests = workload(args, llm.engine.loaded.spec.vocab_size)
    params = [SamplingParams(temperature=0.6, max_tokens=out, ignore_eos=True, seed=i)
              for i, (_, out) in enumerate(requests)]
    llm.generate([requests[0][0]], [SamplingParams(max_tokens=4)])  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([p for p, _ in requests], params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    prompt_tokens = sum(len(p) for p, _ in requests)
    return elapsed, generated, prompt_tokens, llm


def run_transformers(args: argparse.Namespace, path: str, vocab: int) -> tuple[float, int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    requests = workload(args, vocab)
    useful = 0
    start = time.perf_counter()
    for first in range(0, len(requests), args.hf_batch_size):
        batch = requests[first:first + args.hf_batch_size]
        longest = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), longest, dtype=torch.long)
        mask = torch.zeros(len(batch), longest, dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):  # left padding, as generation needs
            ids[row, longest - len(prompt):] = torch.tensor(prompt)
            mask[row, longest - len(prompt):] = 1
        max_new = max(out for _, out in batch)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=0.6, top_p=1.0,
                           top_k=0, max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=0)
        useful += sum(out for _, out in batch)
    return time.perf_counter() - start, useful


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the default model (SmolLM2-135M-Instruct)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    print(f"torch threads: {torch.get_num_threads()}, workload: {args.num_prompts} requests, prompt and output "
          f"lengths uniform in {args.min_len}-{args.max_len}, temperature 0.6, ignore_eos")
    elapsed, generated, prompt_tokens, llm = run_llmctl(args)
    ours = generated / elapsed
    print(f"llmctl:       {elapsed:7.2f} s  {ours:8.1f} output tok/s  {(generated + prompt_tokens) / elapsed:8.1f} "
          f"total tok/s  {args.num_prompts / elapsed:5.2f} req/s  (preemptions: "
          f"{llm.engine.scheduler.num_preemptions})")
    if args.skip_transformers:
        return
    path, vocab = str(llm.engine.loaded.source.path), llm.engine.loaded.spec.vocab_size
    del llm
    elapsed, useful = run_transformers(args, path, vocab)
    theirs = useful / elapsed
    print(f"transformers: {elapsed:7.2f} s  {theirs:8.1f} output tok/s  (generate, padded batches of "
          f"{args.hf_batch_size})")
    print(f"ratio llmctl / transformers: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
