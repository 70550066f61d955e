"""Data-parallel replicas as processes (`--data-parallel-backend mp`, what `serve --dp` runs) against the
same replicas as threads of one process (how llmctl ran them before), alternating in one run: the
default model, D replicas, N concurrent requests of a fixed prompt and output length through the
EngineClient the server uses. Prints each round's output tok/s and the medians.

    python benchmarks/dp_processes.py [--dp 2] [--requests 32] [--output-len 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from alternating import alternate, median_ratios

from llmctl.engine.config import EngineConfig
from llmctl.engine.front.async_engine import AsyncLLMEngine
from llmctl.engine.front.data_parallel import DataParallelEngine, replica_configs
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.engine.sampling_params import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 4


class ThreadReplicas(DataParallelEngine):
    """The replicas as engine threads of this process (the layout before a process per replica)."""

    def __init__(self, config: EngineConfig) -> None:  # not super().__init__: that starts processes
        import threading

        self.on_ray, self._store, self._rounds = False, None, None
        self.replicas = [AsyncLLMEngine(LLMEngine(one)) for one in replica_configs(config)[0]]
        self._outstanding = [0] * len(self.replicas)
        self._serving: dict[str, int] = {}
        self._lock = threading.Lock()


async def run_requests(client: DataParallelEngine, requests: int, output_len: int) -> int:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)

    async def one(index: int) -> int:
        async for output in client.generate(PROMPT, params, f"bench-{index}-{time.monotonic_ns()}"):
            final = output
        return len(final.outputs[0].token_ids)

    return sum(await asyncio.gather(*(one(i) for i in range(requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model id or folder (default: serve's default model)")
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from llmctl.checkpoint.source import resolve_model

    model = args.model or str(resolve_model(None, weights=True, show_progress=False).path)
    config = EngineConfig(model=model, data_parallel_size=args.dp, max_model_len=512)
    clients = {"processes": DataParallelEngine(config), "threads": ThreadReplicas(config)}
    for client in clients.values():
        asyncio.run(run_requests(client, 2, 4))  # warm

    def tokens_per_second(name: str) -> float:
        started = time.perf_counter()
        produced = asyncio.run(run_requests(clients[name], args.requests, args.output_len))
        rate = produced / (time.perf_counter() - started)
        print(f"  {name}: {rate:.1f} output tok/s", flush=True)
        return rate

    try:
        figures = alternate(list(clients), args.rounds, tokens_per_second)
    finally:
        for client in clients.values():
            client.shutdown()
    for name, (median, ratio) in median_ratios(figures, "threads").items():
        print(f"--dp {args.dp}, {args.requests} requests × {args.output_len} tokens, replicas as {name}: "
              f"{median:.1f} output tok/s ({ratio:.2f}× threads)")


if __name__ == "__main__":
    main()
