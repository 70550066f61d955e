"""The `llmctl serve` and `vllm serve` lines plan recommends, as they run on a Ray cluster."""

from __future__ import annotations


def ray_commands(commands: list[str], ranks: int, replicas: int, nodes: int) -> list[str]:
    """The same servers on a Ray cluster: ranks as actors (--distributed-executor-backend ray), replicas as
    actors (--data-parallel-backend ray; llmctl's replicas spawn their ranks on their own node, vLLM's take
    both flags); after `ray start` on every node when the layout spans several."""
    executor = ["--distributed-executor-backend ray"] if ranks > 1 else []
    data_parallel = ["--data-parallel-backend ray"] if replicas > 1 else []
    flags = {"llmctl": data_parallel or executor, "vllm": executor + data_parallel}
    if not flags["vllm"]:
        return []
    start = ["ray start --head --port 6379   # first node; on the others: ray start --address FIRST_NODE:6379"] \
        if nodes > 1 else []
    return start + [f"{c} {' '.join(flags[c.split()[0]])}" for c in commands
                    if c.startswith(("llmctl serve", "vllm serve"))]
