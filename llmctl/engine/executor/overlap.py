"""Async scheduling (vLLM's --async-scheduling; SGLang's overlap scheduler): the model steps run on a thread of
their own, so the engine schedules step N+1 and turns step N−1's tokens into outputs while step N runs.

The engine submits a batch before the one ahead of it has come back (llmctl.engine.front.async_steps). A decode
in that batch needs the token the step ahead is sampling: its row carries a placeholder, which this thread
fills from the step ahead's sampled tokens (`StepBatch.placeholders`) before the forward. The thread samples
every batch that carries its sampling inputs (`StepBatch.sampling`), so the tokens are here for the next one;
each step's tokens reach the host in one copy. Steps run in submission order, one at a time, so a step never
sees a KV block that a later step reuses."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from llmctl.engine.core.step_messages import SampledTokens, StepBatch, StepLogits
from llmctl.engine.sample.sampler import sample

if TYPE_CHECKING:
    from llmctl.engine.executor.executor import Executor

StepResult = StepLogits | SampledTokens
Work = tuple[Callable[[], StepResult | None], Future]


class PreviousStepFailed(RuntimeError):
    """A batch whose placeholders name the tokens of a step that failed."""


class OverlappedExecutor:
    """Runs another executor's steps (local, or the driver of TP ranks) on one step thread."""

    max_in_flight = 1  # lanes: the async steps are one lane two batches deep (not pipeline stages)
    samples_on_last_stage = True  # a batch with `sampling` comes back as SampledTokens
    overlaps = True

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.loaded = inner.loaded
        self._work: queue.SimpleQueue[Work | None] = queue.SimpleQueue()  # None: stop
        self._results: deque[Future] = deque()
        self._previous: list[int] | None = None  # the last step's sampled tokens (the step thread's own)
        self._thread = threading.Thread(target=self._loop, name="llmctl-step", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> object:  # the inner executor's runner, rank_memory, threads, …
        return getattr(self.inner, name)

    def submit(self, batch: StepBatch) -> None:
        self._results.append(self._run(lambda: self._step(batch)))

    def collect(self) -> StepResult:
        return self._results.popleft().result()

    def lend_experts(self) -> None:
        self._run(self.inner.lend_experts).result()

    def healthy(self) -> bool:
        return self._thread.is_alive() and self.inner.healthy()

    def shutdown(self) -> None:
        self._work.put(None)
        self._thread.join(timeout=30)
        self.inner.shutdown()

    def _run(self, call: Callable[[], StepResult | None]) -> Future:
        done: Future = Future()
        self._work.put((call, done))
        return done

    def _loop(self) -> None:
        while (item := self._work.get()) is not None:
            call, done = item
            try:
                done.set_result(call())
            except BaseException as exc:  # the engine fails the step's requests; this thread goes on
                done.set_exception(exc)

    def _step(self, batch: StepBatch) -> StepResult:
        previous, self._previous = self._previous, None
        if batch.placeholders:
            if previous is None:
                raise PreviousStepFailed("the step before this one failed; its tokens are not there to continue from")
            for row, source in batch.placeholders:
                batch.input_ids[row] = previous[source]
        self.inner.submit(batch)
        result = self.inner.collect()
        if batch.sampling is not None and isinstance(result, StepLogits):
            result = SampledTokens(sample(result.sample_logits, batch.sampling))
        if isinstance(result, SampledTokens):
            self._previous = [token for token, _ in result.tokens]
        return result
