"""Expert parallelism across data-parallel replicas (EP = TP × DP, as vLLM spreads experts).

Each replica runs its own batch through attention; at every mixture-of-experts layer the replicas'
tokens meet: each rank gathers the hidden states and router logits of every replica (from the ranks
with its TP position), runs its own whole experts over all of them, and one all-reduce over every
expert rank sums the parts; each replica keeps its own rows. A replica with nothing to run still
takes part in each layer with no tokens of its own (`FusedMoE.lend`), so the collectives always meet.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmctl.engine.distributed.group import new_group


@dataclass(frozen=True)
class ReplicaGroup:
    """Where the replicas meet: the store the data-parallel front started, and which replica this is."""

    host: str
    port: int
    replica: int
    replicas: int
    timeout: float = 30.0  # seconds one exchange may wait for the other replicas


class ReplicaExchange:
    """One rank's side of the exchange; the process groups are made at the first exchange, when every
    replica is stepping (the loads and warm-ups before it keep to their own tokens: `active` False)."""

    def __init__(self, replicas: ReplicaGroup, tp_rank: int, tp: int, device: torch.device) -> None:
        self.replicas, self.tp_rank, self.tp, self.device = replicas, tp_rank, tp, device
        self.active = False
        self._peers: dist.ProcessGroup | None = None  # this TP position in every replica
        self._world: dist.ProcessGroup | None = None  # every expert rank

    @property
    def rank(self) -> int:
        return self.replicas.replica * self.tp + self.tp_rank

    @property
    def size(self) -> int:
        return self.replicas.replicas * self.tp

    def combine(self, x: torch.Tensor, logits: torch.Tensor,
                experts: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x [T, H], router logits [T, E] -> Σ over every rank's experts, for this replica's T tokens.
        `experts(x, logits)` runs this rank's experts only (zero for tokens routed elsewhere)."""
        peers, world = self._groups()
        tokens, hidden = x.shape
        counts = self._gather(peers, torch.tensor([tokens], device=x.device))
        most = int(max(c.item() for c in counts))
        rows = torch.zeros(most, hidden + logits.shape[1], dtype=torch.float32, device=x.device)
        rows[:tokens] = torch.cat([x.float(), logits.float()], dim=-1)  # float32 holds bf16/fp16 exactly
        every = torch.cat(self._gather(peers, rows))
        partial = experts(every[:, :hidden].to(x.dtype).contiguous(), every[:, hidden:].contiguous())
        world.allreduce([partial]).wait()
        start = self.replicas.replica * most
        return partial[start:start + tokens]

    def _gather(self, group: dist.ProcessGroup, tensor: torch.Tensor) -> list[torch.Tensor]:
        parts = [torch.empty_like(tensor) for _ in range(self.replicas.replicas)]
        group.allgather([parts], [tensor]).wait()
        return parts

    def _groups(self) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
        if self._world is None:
            r = self.replicas
            store = dist.TCPStore(r.host, r.port, is_master=False, timeout=datetime.timedelta(seconds=r.timeout))
            self._peers = new_group(store, f"experts-tp{self.tp_rank}/", r.replica, r.replicas, r.timeout,
                                    self.device)
            self._world = new_group(store, "experts-all/", self.rank, self.size, r.timeout, self.device)
        return self._peers, self._world


@dataclass(frozen=True)
class ExpertPlacement:
    """Whole experts spread over `size` ranks (--enable-expert-parallel); this rank holds its share."""

    rank: int
    size: int
    exchange: ReplicaExchange | None = None  # replicas' tokens meet at each MoE layer (EP across DP)


def expert_placement(enabled: bool, replicas: ReplicaGroup | None, tp_rank: int, tp: int,
                     device: torch.device) -> ExpertPlacement | None:
    """None without expert parallelism; EP = TP within one replica; EP = TP × DP across replicas."""
    if not enabled:
        return None
    if replicas is None or replicas.replicas == 1:
        return ExpertPlacement(tp_rank, tp)
    exchange = ReplicaExchange(replicas, tp_rank, tp, device)
    return ExpertPlacement(exchange.rank, exchange.size, exchange)
