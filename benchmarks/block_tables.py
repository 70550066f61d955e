"""What a decode step spends on block tables: whole tables built into a padded host tensor and copied
(before), against the worker's copy updated with the step's new entries and gathered on the device.

    python benchmarks/block_tables.py [--seqs 256] [--context 131072] [--block-size 16] [--device cuda]

Each decode step appends one block to every 16th sequence (one token a step, 16 tokens a block).
"""

from __future__ import annotations

import argparse
import time

import torch

from llmctl.engine.core.step_messages import StepBatch, TableUpdate
from llmctl.engine.worker.block_tables import BlockTableCopy
from llmctl.kernels.transfer import to_device


def whole_tables(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """The Triton backend's path for whole tables (TritonAttention.prepare without a device copy)."""
    width = max(len(t) for t in tables)
    host = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return to_device(host, torch.int32, device)


def step_batch(tables: list[list[int]], step: int, block_size: int) -> StepBatch:
    updates = []
    for row, table in enumerate(tables):
        if (row + step) % block_size == 0:  # this sequence's new token opens a block
            table.append(len(table))
            updates.append(TableUpdate(row, len(table) - 1, [[table[-1]]]))
    rows = list(range(len(tables)))
    return StepBatch([], [], [], [], [], [], [], table_rows=rows, table_updates=updates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--context", type=int, default=131072)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    blocks = args.context // args.block_size
    tables = [list(range(blocks)) for _ in range(args.seqs)]
    copy = BlockTableCopy(1, device)
    copy.apply(StepBatch([], [], [], [], [], [], [], table_rows=list(range(args.seqs)),
                         table_updates=[TableUpdate(r, 0, [list(t)]) for r, t in enumerate(tables)]))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timings = {"whole tables, host tensor + copy": [], "changes applied + gathered on the device": []}
    for step in range(args.steps):
        batch = step_batch(tables, step, args.block_size)
        sync()
        began = time.perf_counter()
        whole_tables(tables, device)
        sync()
        middle = time.perf_counter()
        copy.apply(batch)
        copy.gathered(0, max(len(t) for t in batch.block_tables))
        sync()
        timings["whole tables, host tensor + copy"].append(middle - began)
        timings["changes applied + gathered on the device"].append(time.perf_counter() - middle)
    print(f"{args.seqs} sequences × {args.context} tokens ({blocks} blocks of {args.block_size}), {device}:")
    for name, values in timings.items():
        print(f"  {name}: {sorted(values)[len(values) // 2] * 1e3:.2f} ms per decode step (median of {args.steps})")


if __name__ == "__main__":
    main()
