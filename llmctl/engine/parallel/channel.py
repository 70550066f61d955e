"""Messages between ranks: pickled objects (step batches, logits) and hidden-state tensors.

Each rank holds two sets of groups. Control groups carry the next step to an idle worker
and wait as long as it takes; data groups carry everything inside a step (all-reduces,
hidden states, logits) and give up after `step_timeout` seconds, so a worker that died or
hangs fails the step instead of hanging the server.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from typing import Callable

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


class _TensorsApart(pickle.Pickler):
    """Pickles an object with its tensors left out (their shape and dtype stand in), so they
    travel as raw bytes after it: pickling a tensor's storage costs more than sending it. They
    go through the CPU (gloo) and arrive as CPU tensors."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []

    def persistent_id(self, obj: object) -> tuple | None:
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj.detach().cpu().contiguous())
            return ("tensor", tuple(obj.shape), str(obj.dtype).removeprefix("torch."))
        return None


class _TensorsReceived(pickle.Unpickler):
    def __init__(self, payload: bytes, receive: Callable[[torch.Tensor], None]) -> None:
        super().__init__(io.BytesIO(payload))
        self.receive = receive

    def persistent_load(self, pid: tuple) -> torch.Tensor:
        _, shape, dtype = pid
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        self.receive(tensor)
        return tensor


def encode(obj: object) -> list[torch.Tensor]:
    """[size, pickled object, tensor, tensor, …]"""
    buffer = io.BytesIO()
    pickler = _TensorsApart(buffer)
    pickler.dump(obj)
    payload = torch.frombuffer(bytearray(buffer.getbuffer()), dtype=torch.uint8)
    return [torch.tensor([payload.numel()], dtype=torch.int64), payload, *pickler.tensors]


def send_object(outbox: Outbox, pg: dist.ProcessGroup, obj: object, dst: int) -> None:
    outbox.send(pg, encode(obj), dst)


def recv_object(pg: dist.ProcessGroup, src: int) -> object:
    size = torch.empty(1, dtype=torch.int64)
    pg.recv([size], src, 0).wait()
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.recv([payload], src, 0).wait()
    return _TensorsReceived(payload.numpy().tobytes(), lambda t: pg.recv([t], src, 0).wait()).load()


def broadcast_object(pg: dist.ProcessGroup, obj: object | None, root: int = 0) -> object:
    """`obj` from the root to every member (the others pass None)."""
    options = dist.BroadcastOptions()
    options.rootRank = root
    if obj is not None:
        for tensor in encode(obj):
            pg.broadcast([tensor], options).wait()
        return obj
    size = torch.empty(1, dtype=torch.int64)
    pg.broadcast([size], options).wait()
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    pg.broadcast([payload], options).wait()
    return _TensorsReceived(payload.numpy().tobytes(), lambda t: pg.broadcast([t], options).wait()).load()


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
