"""Ranks and the collectives tensor-parallel layers use.

Process groups are built directly on a TCPStore (not torch.distributed's global default
group), so several engines — data-parallel replicas — can live in one process, each with
its own groups. Global rank = pp_rank · TP + tp_rank, as in vLLM; rank 0 is the driver.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Rank:
    """Where one process sits in a TP × PP layout."""

    rank: int
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def peer_in_stage(self, stage: int) -> int:
        """The rank with this TP position in another pipeline stage."""
        return stage * self.tp + self.tp_rank

    @property
    def last_stage_leader(self) -> int:
        return (self.pp - 1) * self.tp


def local_rank(rank: Rank) -> int:
    """This process's index on its machine: LOCAL_RANK under torchrun, else the rank."""
    import os

    return int(os.environ.get("LOCAL_RANK", rank.rank))


class TPGroup:
    """all-reduce / all-gather over the TP ranks of one pipeline stage (no-ops for TP 1)."""

    def __init__(self, rank: int = 0, size: int = 1, pg: dist.ProcessGroup | None = None) -> None:
        self.rank, self.size, self.pg = rank, size, pg

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.pg.allreduce([x]).wait()
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's x along the last dimension."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.pg.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)


def new_group(store: dist.Store, prefix: str, rank: int, size: int, timeout: float,
              device: torch.device) -> dist.ProcessGroup:
    """A standalone process group on `store`: gloo on CPU, NCCL for CUDA tensors."""
    scoped = dist.PrefixStore(prefix, store)
    delta = datetime.timedelta(seconds=timeout)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = delta
        return dist.ProcessGroupNCCL(scoped, rank, size, options)
    return dist.ProcessGroupGloo(scoped, rank, size, delta)
