"""The KV cache's CPU tier (--kv-offloading-size) on two long conversations whose K/V does not fit the device pool
together: each conversation's second turn, timed to its first token, with the tier and without it, side by side in
one run (the model loaded once per setting; the turns alternate between the settings, repeated).

    python benchmarks/kv_offloading.py                           # the default model, two 1,500-token conversations
    python benchmarks/kv_offloading.py --model DIR --tokens 3000 --repeats 5

Without the tier the second turn recomputes whatever prefix the pool evicted; with it, the evicted blocks are
loaded back from CPU memory. The tier's counters (vLLM's external_prefix_cache_hits) are printed too."""

from __future__ import annotations

import argparse
import random
import statistics
import time

from llmctl import LLM, SamplingParams
from llmctl.checkpoint.source import resolve_model

REPLY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1)


def conversation(seed: int, tokens: int, vocab: int) -> tuple[list[int], list[int]]:
    """A long first turn (a document and a question) and the second turn's new question, as token ids."""
    rng = random.Random(seed)
    return [rng.randrange(1000, vocab) for _ in range(tokens)], [rng.randrange(1000, vocab) for _ in range(24)]


def second_turn_ttfts(llm: LLM, turns: list[tuple[list[int], list[int]]]) -> list[float]:
    """Both first turns, then each second turn's seconds to its first token."""
    prompts = []
    for first, question in turns:
        reply = llm.generate([first], REPLY)[0].outputs[0].token_ids
        prompts.append(first + list(reply) + question)
    seconds = []
    for prompt in prompts:
        started = time.perf_counter()
        llm.generate([prompt], FIRST_TOKEN)
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a model folder or GGUF (default: the default model)")
    parser.add_argument("--tokens", type=int, default=1500, help="tokens of each conversation's first turn")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = args.model or str(resolve_model(None, show_progress=False).path)
    length = args.tokens + 128  # the first turn, its reply and the second question
    probe = LLM(model, max_model_len=length, kv_cache_memory=2**28)
    block_bytes, block_size = probe.engine.loaded.kv_geometry.block_bytes, probe.engine.config.block_size
    vocab = probe.engine.loaded.spec.vocab_size
    del probe
    blocks = -(-length // block_size)
    pool = int(1.3 * blocks) * block_bytes  # one conversation and a third: the other's prefix is evicted
    tier_gib = 4 * blocks * block_bytes / 2**30
    settings = {"without the tier": LLM(model, max_model_len=length, kv_cache_memory=pool),
                "with the tier": LLM(model, max_model_len=length, kv_cache_memory=pool, kv_offloading_size=tier_gib)}
    print(f"{model}: device pool {pool / 2**20:.1f} MiB ({int(1.3 * blocks)} blocks of {block_size} tokens), "
          f"tier {tier_gib * 1024:.1f} MiB; two conversations of {args.tokens} tokens, second turns timed")
    times: dict[str, list[float]] = {name: [] for name in settings}
    for repeat in range(args.repeats):
        turns = [conversation(100 * repeat + i, args.tokens, vocab) for i in range(2)]
        for name, llm in settings.items():
            times[name] += second_turn_ttfts(llm, turns)
    for name, llm in settings.items():
        stats = llm.engine.stats()
        tier = f"; tier hits {stats.offload.hits:,} tokens, {stats.offload.load_bytes / 2**20:,.1f} MiB loaded, " \
               f"{stats.offload.store_bytes / 2**20:,.1f} MiB stored" if stats.offload else ""
        print(f"{name}: second-turn TTFT median {statistics.median(times[name]) * 1000:,.1f} ms "
              f"(of {len(times[name])}); prefix-cache hits {stats.prefix_cache_hits:,} tokens{tier}")
    ratio = statistics.median(times["with the tier"]) / statistics.median(times["without the tier"])
    print(f"TTFT with the tier / without: {ratio:.2f}")


if __name__ == "__main__":
    main()
