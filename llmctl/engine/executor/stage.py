"""One rank's share of a step: receive the batch, run this stage's layers, pass the result on.

Rank 0 (the driver) also runs a stage: stage 0, TP rank 0. It hands each batch to its TP
peers by broadcast; every stage forwards the batch with its hidden states to the same TP
position of the next stage; the last stage's TP rank 0 sends the result back to rank 0 (to its
ResultReceiver): the sampled tokens when the batch carries its sampling inputs, as vLLM samples
on the last stage, so no vocabulary-wide logits cross ranks; else the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from llmctl.engine.config import EngineConfig
from llmctl.engine.core.step_messages import SampledTokens, StepBatch, StepFailed, StepLogits
from llmctl.engine.distributed.channel import (
    Groups,
    Outbox,
    all_gather_ints,
    all_reduce_min,
    broadcast_object,
    connect,
    recv_object,
    send_object,
)
from llmctl.engine.distributed.expert_exchange import expert_placement
from llmctl.engine.distributed.group import Rank
from llmctl.engine.sample.sampler import sample
from llmctl.engine.worker.cuda_graphs import step_graphs
from llmctl.engine.worker.loaded_model import LoadedModel, Placement
from llmctl.engine.worker.loader import device_for, load_model
from llmctl.engine.worker.model_runner import ModelRunner, make_runner


@dataclass
class Stop:
    """Sent instead of a batch: the worker exits its loop."""


@dataclass
class LendExperts:
    """Sent instead of a batch (EP across replicas): this replica has no batch, its experts serve the others'."""


def step_result(batch: StepBatch, logits: StepLogits) -> StepLogits | SampledTokens | StepFailed:
    """The last stage's answer to the driver."""
    if batch.sampling is None:
        return logits
    try:
        tokens = sample(logits.sample_logits, batch.sampling) if batch.sampling else []
        return SampledTokens(tokens, logits.pooled)
    except Exception as exc:  # the step's requests fail, not the rank
        return StepFailed(f"sampling failed: {exc}")


class StageRunner:
    """The rank-local part of the pipeline, shared by the driver and the workers."""

    def __init__(self, loaded: LoadedModel, runner: ModelRunner, groups: Groups) -> None:
        self.loaded, self.runner, self.groups, self.rank = loaded, runner, groups, groups.rank
        self.outbox = Outbox()
        self.rank_memory: list[tuple[int, int]] = []  # (weights, KV) bytes of every rank, gathered at startup

    def receive(self) -> StepBatch | Stop:
        """Wait (idle, without a time limit) for the next batch; a later stage gets hidden states with it."""
        rank = self.rank
        if rank.is_first_stage:
            return broadcast_object(self.groups.tp_control, None)
        return recv_object(self.groups.world_control, rank.peer_in_stage(rank.pp_rank - 1))

    def hidden_from_previous(self, batch: StepBatch) -> torch.Tensor:
        hidden = torch.empty(batch.num_tokens, self.loaded.spec.hidden_size, dtype=self.loaded.dtype)
        self.groups.world_data.recv([hidden], self.rank.peer_in_stage(self.rank.pp_rank - 1), 0).wait()
        return hidden.to(self.loaded.device)

    def run(self, message: StepBatch | Stop | LendExperts) -> StepLogits | None:
        """This rank's part of one step; returns the logits where they end up in this process."""
        rank = self.rank
        if rank.rank == 0 and rank.tp > 1:
            broadcast_object(self.groups.tp_control, message)
        if isinstance(message, LendExperts):  # pipeline parallelism is refused with EP across replicas
            self.runner.lend_experts()
            return None
        if isinstance(message, Stop):
            self._pass_on(message, None)
            return None
        hidden = None if rank.is_first_stage else self.hidden_from_previous(message)
        hidden = self.runner.forward(message, hidden)
        if not rank.is_last_stage:
            self._pass_on(message, hidden)
            return None
        logits = self.runner.logits(message, hidden)
        if rank.tp_rank == 0 and rank.rank != 0:
            send_object(self.outbox, self.groups.results, step_result(message, logits), 0)
        return logits

    def _pass_on(self, message: StepBatch | Stop, hidden: torch.Tensor | None) -> None:
        rank = self.rank
        if rank.is_last_stage:
            return
        peer = rank.peer_in_stage(rank.pp_rank + 1)
        send_object(self.outbox, self.groups.world_control, message, peer)
        if hidden is not None:
            self.outbox.send(self.groups.world_data, [hidden.contiguous().cpu()], peer)

    def serve_forever(self) -> None:
        """A worker's loop: steps until the driver says stop."""
        while True:
            message = self.receive()
            self.run(message)
            if isinstance(message, Stop):
                self.outbox.flush()
                return


def build_stage(config: EngineConfig, rank: Rank, store: dist.Store) -> StageRunner:
    """Any rank: join the groups, load this rank's shard, agree on the KV pool, report memory."""
    groups = connect(store, rank, device_for(config.device, rank))
    experts = expert_placement(config.enable_expert_parallel, config.replica_group, rank.tp_rank, rank.tp,
                               device_for(config.device, rank))
    placement = Placement(rank, groups.tp, lambda blocks: all_reduce_min(groups.world_control, blocks), experts)
    loaded = load_model(config, placement)
    stage = StageRunner(loaded, make_runner(loaded, config.block_size), groups)
    stage.runner.graphs = step_graphs(loaded, config)  # every TP rank captures the same graphs, in the same order
    stage.rank_memory = [tuple(m) for m in all_gather_ints(
        groups.world_control, [loaded.weights_bytes, loaded.kv_cache_bytes], rank.world_size)]
    return stage
