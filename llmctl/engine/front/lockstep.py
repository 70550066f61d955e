"""Data-parallel replicas that step together (expert parallelism across replicas).

When the replicas' MoE layers exchange tokens, every replica must run a forward pass in every step
(vLLM runs a dummy batch on an idle DP rank for the same reason). A round opens as soon as one replica
has a batch; in it, each replica runs the batch it had posted by then, or lends its experts to the
others without tokens of its own. Each replica has a forward thread that takes part in every round;
its engine thread posts batches and waits for them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from llmctl.engine.core.step_messages import StepBatch

logger = logging.getLogger("llmctl.engine")


class LockstepRounds:
    def __init__(self, replicas: int) -> None:
        self._cond = threading.Condition()
        self._posted: list[tuple[Callable[[], None], Future] | None] = [None] * replicas
        self._plan: list[tuple[Callable[[], None], Future] | None] = [None] * replicas
        self._opened = 0  # rounds opened so far
        self._done = [0] * replicas  # rounds each replica has finished
        self._stopping = False

    def run(self, replica: int, forward: Callable[[], None]) -> None:
        """A replica's engine thread: run `forward` in the next round; its exception is raised here."""
        future: Future = Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("the replicas are stopping")
            self._posted[replica] = (forward, future)
            self._cond.notify_all()
        future.result()

    def serve(self, replica: int, lend: Callable[[], None]) -> None:
        """A replica's forward thread: one forward per round (its posted batch, else `lend`) until stopped."""
        while True:
            job = self._next_job(replica)
            if job is False:
                return
            if job is None:
                try:
                    lend()
                except Exception:  # the exchange timed out or a worker died: the engines report it
                    logger.exception("replica %d could not lend its experts to this step", replica)
            else:
                forward, future = job
                try:
                    forward()
                    future.set_result(None)
                except BaseException as exc:  # the engine thread reports it; the rounds go on
                    future.set_exception(exc)
            with self._cond:
                self._done[replica] += 1
                self._cond.notify_all()

    def _next_job(self, replica: int) -> Any:
        with self._cond:
            while True:
                if self._stopping:
                    job = self._plan[replica] if self._opened > self._done[replica] else None
                    if job is not None:  # the other replicas may have left: never start it
                        job[1].set_exception(RuntimeError("the replicas are stopping"))
                    return False
                if self._opened > self._done[replica]:
                    return self._plan[replica]
                if all(done == self._opened for done in self._done) and any(self._posted):
                    self._plan, self._posted = self._posted, [None] * len(self._posted)
                    self._opened += 1
                    self._cond.notify_all()
                    continue
                self._cond.wait()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            for job in self._posted:
                if job is not None:
                    job[1].set_exception(RuntimeError("the replicas are stopping"))
            self._cond.notify_all()


class LockstepExecutor:
    """One replica's executor with its forwards run in rounds; everything else is the executor's own."""

    def __init__(self, executor: Any, rounds: LockstepRounds, replica: int) -> None:
        self._executor, self._rounds, self._replica = executor, rounds, replica
        self._thread = threading.Thread(target=rounds.serve, args=(replica, executor.lend_experts),
                                        name=f"llmctl-replica-{replica}-forward", daemon=True)
        self._thread.start()

    def submit(self, batch: StepBatch) -> None:
        batch.exchange_experts = True
        self._rounds.run(self._replica, lambda: self._executor.submit(batch))

    def __getattr__(self, name: str) -> Any:  # collect, loaded, max_in_flight, healthy, shutdown, …
        return getattr(self._executor, name)
