"""The data-parallel front's routing when a Ray replica is lost unnoticed (`DataParallelEngine.generate`).

A CI run of tests/engine/executor/test_ray.py met this by chance: the second node was killed, and a request the
least-loaded pick sent to its replica — still counted as running, since nothing had called it since —
failed with a 500. That test cannot force the order (each replica's loop polls its actor twice a
second), so here two stand-in replicas do: the first answers its next request with WorkerLostError, as
`RayReplicaEngine` does for a lost actor, before any output."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.data_parallel import DataParallelEngine
from llmctl.engine.sampling_params import SamplingParams


class Replica:
    """A replica's generate: its outputs, or a lost actor's error after `lose_after` of them."""

    def __init__(self, outputs: list[str], lose_after: int | None = None) -> None:
        self.outputs, self.lose_after, self.is_running, self.requests = outputs, lose_after, True, 0

    async def generate(self, prompt, params, request_id, lora_request):
        self.requests += 1
        for produced, output in enumerate(self.outputs):
            if produced == self.lose_after:
                self.is_running = False
                raise WorkerLostError("the Ray replica's actor was lost (ActorDiedError)")
            yield output

    def tokenize(self, prompt):
        return self._answer((None, [len(self.outputs)]))

    def _answer(self, answer):
        """A remote call: a lost actor's error when this replica goes on its next call."""
        if self.lose_after == 0:
            self.is_running = False
            raise WorkerLostError("the Ray replica's actor was lost (ActorUnavailableError)")
        return answer


def front(replicas: list[Replica], on_ray: bool = True) -> DataParallelEngine:
    engine = DataParallelEngine.__new__(DataParallelEngine)  # the routing state alone, no engines built
    engine.on_ray, engine.replicas = on_ray, replicas
    engine._outstanding, engine._serving, engine._lock = [0] * len(replicas), {}, threading.Lock()
    return engine


def run(engine: DataParallelEngine) -> list[str]:
    async def collect() -> list[str]:
        return [out async for out in engine.generate([1, 2, 3], SamplingParams(max_tokens=4), "request-1")]
    return asyncio.run(collect())


def test_a_request_picked_for_a_lost_ray_replica_is_answered_by_a_running_one():
    lost, running = Replica(["a", "b"], lose_after=0), Replica(["c", "d"])
    engine = front([lost, running])
    assert engine.pick() == 0  # both idle: the first is picked, as in the CI run
    assert run(engine) == ["c", "d"]
    assert (lost.requests, running.requests) == (1, 1)
    assert engine._outstanding == [0, 0] and engine._serving == {}
    assert engine.pick() == 1  # the lost one is not picked again


def test_a_stream_that_already_produced_output_still_fails():
    engine = front([Replica(["a", "b"], lose_after=1), Replica(["c", "d"])])
    with pytest.raises(WorkerLostError):
        run(engine)  # its client has part of an answer: another replica cannot continue it


def test_local_replicas_and_a_cluster_with_none_left_fail_the_request():
    with pytest.raises(WorkerLostError):  # local replicas: all or nothing, as before
        run(front([Replica(["a"], lose_after=0), Replica(["c"])], on_ray=False))
    both = [Replica(["a"], lose_after=0), Replica(["c"], lose_after=0)]
    with pytest.raises(WorkerLostError):
        run(front(both))
    assert [r.requests for r in both] == [1, 1]


def test_tokenize_comes_from_a_running_replica_when_the_first_is_lost():
    """The CI failure of 2026-11-29: Ray placed replica 0 on the node that went, and the next request's
    tokenization (always replica 0's) failed with a 500."""
    lost, running = Replica(["a"], lose_after=0), Replica(["c", "d"])
    engine = front([lost, running])
    assert engine.tokenize("hi") == (None, [2])  # replica 0 found lost by this call: replica 1 answers
    with pytest.raises(WorkerLostError):
        front([Replica(["a"], lose_after=0)]).tokenize("hi")
