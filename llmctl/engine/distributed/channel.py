"""Messages between ranks: pickled objects (step batches, logits) and hidden-state tensors.

Each rank holds two sets of groups. Control groups carry the next step to an idle worker
and wait as long as it takes; data groups carry everything inside a step (all-reduces,
hidden states, logits) and give up after `step_timeout` seconds, so a worker that died or
hangs fails the step instead of hanging the server.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmctl.engine.distributed.group import Rank, TPGroup, new_group

IDLE_TIMEOUT = 7 * 24 * 3600.0  # a worker waits this long for the next step
STEP_TIMEOUT = float(os.environ.get("LLMCTL_STEP_TIMEOUT", "30"))  # seconds inside one step


@dataclass
class Groups:
    """This rank's process groups: every rank (p2p between stages) and its stage's TP ranks."""

    rank: Rank
    world_control: dist.ProcessGroup
    world_data: dist.ProcessGroup
    results: dist.ProcessGroup  # the last stage's results to the driver, received on a thread of its own
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
        results=new_group(store, "world-results/", rank.rank, size, STEP_TIMEOUT, cpu),
        tp_control=new_group(store, f"{stage}-control/", rank.tp_rank, rank.tp, IDLE_TIMEOUT, cpu),
        tp_data=new_group(store, f"{stage}-data/", rank.tp_rank, rank.tp, STEP_TIMEOUT, device),
    )


class Outbox:
    """Sends that complete in the background; their buffers stay alive until they have.

    A gloo send reports completion only once waited on, so the outbox waits on its oldest
    sends beyond MAX_PENDING: long received by then (at most PP batches are in flight), they
    return at once, and a long-running server keeps a bounded number of buffers."""

    MAX_PENDING = 32

    def __init__(self) -> None:
        self._pending: deque[tuple[dist.Work, torch.Tensor]] = deque()
        self.sent = 0

    def send(self, pg: dist.ProcessGroup, tensors: list[torch.Tensor], dst: int) -> None:
        for tensor in tensors:
            self._pending.append((pg.send([tensor], dst, 0), tensor))
            self.sent += 1
        while len(self._pending) > self.MAX_PENDING:
            self._pending.popleft()[0].wait()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        while self._pending:
            self._pending.popleft()[0].wait()


FIRST_PART = 64 * 1024  # bytes every message starts with: a step's batch fits, so one round trip sends it
ALIGN = 64  # tensors start at multiples of this in a message, so they can be viewed in place


class _TensorsApart(pickle.Pickler):
    """Pickles an object with its tensors left out (their place, shape and dtype stand in), so
    they travel as raw bytes in the same buffer: pickling a tensor's storage costs more than
    copying it, and every separate gloo message costs a round trip (~0.2 ms here)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self.nbytes = 0  # of the tensors, each padded to ALIGN

    def persistent_id(self, obj: object) -> tuple | None:
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach().cpu().contiguous()
            self.tensors.append(tensor)
            offset, self.nbytes = self.nbytes, self.nbytes + _aligned(tensor.numel() * tensor.element_size())
            return ("tensor", offset, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        return None


class _TensorsInPlace(pickle.Unpickler):
    """Unpickles a message; its tensors are views of the received buffer (no copies)."""

    def __init__(self, header: bytes, tensor_bytes: torch.Tensor) -> None:
        super().__init__(io.BytesIO(header))
        self.tensor_bytes = tensor_bytes

    def persistent_load(self, pid: tuple) -> torch.Tensor:
        _, offset, shape, dtype = pid
        dtype = getattr(torch, dtype)
        count = math.prod(shape) * dtype.itemsize
        return self.tensor_bytes[offset:offset + count].view(dtype).view(shape)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def encode(obj: object) -> list[torch.Tensor]:
    """One message as [first part] or [first part, rest]: the first FIRST_PART bytes hold the
    total size, the header's size, the pickled header and then the tensors' bytes."""
    buffer = io.BytesIO()
    pickler = _TensorsApart(buffer)
    pickler.dump(obj)
    header = buffer.getbuffer()
    tensors_at = _aligned(16 + len(header))
    total = max(FIRST_PART, tensors_at + pickler.nbytes)
    message = torch.empty(total, dtype=torch.uint8)
    message[:16].view(torch.int64).copy_(torch.tensor([total, len(header)]))
    message[16:16 + len(header)] = torch.frombuffer(header, dtype=torch.uint8)
    offset = tensors_at
    for tensor in pickler.tensors:
        nbytes = tensor.numel() * tensor.element_size()
        message[offset:offset + nbytes] = tensor.reshape(-1).view(torch.uint8)
        offset += _aligned(nbytes)
    return [message[:FIRST_PART], message[FIRST_PART:]] if total > FIRST_PART else [message]


def _decode(first: torch.Tensor, receive_rest: Callable[[torch.Tensor], None]) -> object:
    total, header_size = first[:16].view(torch.int64).tolist()
    message = first
    if total > FIRST_PART:
        message = torch.empty(total, dtype=torch.uint8)
        message[:FIRST_PART] = first
        receive_rest(message[FIRST_PART:])
    header = message[16:16 + header_size].numpy().tobytes()
    return _TensorsInPlace(header, message[_aligned(16 + header_size):]).load()


def send_object(outbox: Outbox, pg: dist.ProcessGroup, obj: object, dst: int) -> None:
    outbox.send(pg, encode(obj), dst)


def recv_object(pg: dist.ProcessGroup, src: int) -> object:
    first = torch.empty(FIRST_PART, dtype=torch.uint8)
    pg.recv([first], src, 0).wait()
    return _decode(first, lambda rest: pg.recv([rest], src, 0).wait())


def broadcast_object(pg: dist.ProcessGroup, obj: object | None, root: int = 0) -> object:
    """`obj` from the root to every member (the others pass None)."""
    options = dist.BroadcastOptions()
    options.rootRank = root
    if obj is not None:
        for part in encode(obj):
            pg.broadcast([part], options).wait()
        return obj
    first = torch.empty(FIRST_PART, dtype=torch.uint8)
    pg.broadcast([first], options).wait()
    return _decode(first, lambda rest: pg.broadcast([rest], options).wait())


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
