"""Messages between ranks: pickled objects (step batches, logits) and hidden-state tensors.

Each rank holds two sets of groups. Control groups carry the next step to an idle worker
and wait as long as it takes; data groups carry everything inside a step (all-reduces,
hidden states, logits) and give up after `step_timeout` seconds, so a worker that died or
hangs fails the step instead of hanging the server.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmctl.engine.parallel.group import Rank, TPGroup, new_group

IDLE_TIMEOUT = 7 * 24 * 3600.0  # a worker waits this long for the next step
STEP_TIMEOUT = float(os.environ.get("LLMCTL_STEP_TIMEOUT", "30"))  # seconds inside one step


@dataclass
class Groups:
    """This rank's process groups: every rank (p2p between stages) and its stage's TP ranks."""

    rank: Rank
    world_control: dist.ProcessGroup
    world_data: dist.ProcessGroup
    tp_control: dist.ProcessGroup
    tp_data: dist.ProcessGroup

    @property
    def tp(self) -> TPGroup:
        return TPGroup(self.rank.tp_rank, self.rank.tp, self.tp_data)


def connect(store: dist.Store, rank: Rank, device: torch.device) -> Groups:
    size, stage = rank.world_size, f"stage{rank.pp_rank}"
    cpu = torch.device("cpu")
    return Groups(
        rank,
        world_control=new_group(store, "world-control/", rank.rank, size, IDLE_TIMEOUT, cpu),
        world_data=new_group(store, "world-data/", rank.rank, size, STEP_TIMEOUT, cpu),
        tp_control=new_group(store, f"{stage}-control/", rank.tp_rank, rank.tp, IDLE_TIMEOUT, cpu),
        tp_data=new_group(store, f"{stage}-data/", rank.tp_rank, rank.tp, STEP_TIMEOUT, device),
    )


class Outbox:
    """Sends that complete in the background; their buffers stay alive until they have."""

    def __init__(self) -> None:
        self._pending: list[tuple[dist.Work, list[torch.Tensor]]] = []

    def send(self, pg: dist.ProcessGroup, tensors: list[torch.Tensor], dst: int) -> None:
        self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]
        for tensor in tensors:
            self._pending.append((pg.send([tensor], dst, 0), [tensor]))

    def flush(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending = []


def encode(obj: object) -> list[torch.Tensor]:
    payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    return [torch.tensor([payload.numel()], dtype=torch.int64), payload]


def send_object(outbox: Outbox, pg: dist.ProcessGroup, obj: object, dst: int) -> None:
    outbox.send(pg, encode(obj), dst)


def recv_object(pg: dist.ProcessGroup, src: int) -> object:
    size = torch.empty(1, dtype=torch.int64)
    pg.recv([size], src, 0).wait()
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.recv([payload], src, 0).wait()
    return pickle.loads(payload.numpy().tobytes())


def broadcast_object(pg: dist.ProcessGroup, obj: object | None, root: int = 0) -> object:
    """`obj` from the root to every member (the others pass None)."""
    options = dist.BroadcastOptions()
    options.rootRank = root
    size, payload = encode(obj) if obj is not None else (torch.empty(1, dtype=torch.int64), None)
    pg.broadcast([size], options).wait()
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.broadcast([payload], options).wait()
    return obj if obj is not None else pickle.loads(payload.numpy().tobytes())


def all_reduce_min(pg: dist.ProcessGroup, value: int) -> int:
    tensor = torch.tensor([value], dtype=torch.int64)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MIN
    pg.allreduce([tensor], options).wait()
    return int(tensor.item())


def all_gather_ints(pg: dist.ProcessGroup, values: list[int], size: int) -> list[list[int]]:
    mine = torch.tensor(values, dtype=torch.int64)
    parts = [torch.empty_like(mine) for _ in range(size)]
    pg.allgather([parts], [mine]).wait()
    return [p.tolist() for p in parts]
