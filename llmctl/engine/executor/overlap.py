"""Async scheduling (vLLM's --async-scheduling; SGLang's overlap scheduler): the model steps run on a thread of
their own, so the engine schedules step N+1 and turns step N−1's tokens into outputs while step N runs.

The engine submits a batch before the one ahead of it has come back (LLMEngine._submit_ahead). A decode in that
batch needs the token the step ahead is sampling: its row carries a placeholder (`StepBatch.placeholders`). The
thread samples every batch that carries its sampling inputs (`StepBatch.sampling`), so the tokens are at hand
for the next one:
- in this process's model (the local executor), they stay on the device: the runner fills the placeholders
  there, and the thread launches the next step before it copies the last one's tokens to the host (the step's
  one wait for the device), so a GPU has the next step queued while the host waits;
- with TP ranks, which receive the batch as a message, the thread writes them into the batch on the host.
Steps run in submission order, one at a time, so a step never sees a KV block that a later step reuses."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from llmctl.engine.core.step_messages import SampledTokens, StepBatch, StepLogits
from llmctl.engine.sample.sampler import DeviceSample, sample_on_device, sampled_on_host

if TYPE_CHECKING:
    from llmctl.engine.executor.executor import Executor

StepResult = StepLogits | SampledTokens
Work = tuple[Callable[[], StepResult | DeviceSample | None], Future]


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
        self._runner = getattr(inner, "runner", None)  # the local executor's: placeholders filled on the device
        self._work: queue.SimpleQueue[Work | None] = queue.SimpleQueue()  # None: stop
        self._results: deque[Future] = deque()
        self._previous: list[int] | None = None  # TP: the last step's sampled tokens on the host
        self._previous_device: DeviceSample | None = None  # local: the last step's, on the device
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

    def _run(self, call: Callable[[], StepResult | DeviceSample | None]) -> Future:
        done: Future = Future()
        self._work.put((call, done))
        return done

    def _loop(self) -> None:
        """Each call in order; a step sampled on the device is answered after the next call is launched, or
        as soon as no call waits."""
        waiting: tuple[Future, DeviceSample] | None = None
        while True:
            try:
                item = self._work.get(block=waiting is None)
            except queue.Empty:  # nothing queued: the waiting step's tokens go to the host now
                _answer(waiting)
                waiting = None
                continue
            if item is None:
                _answer(waiting)
                return
            call, done = item
            try:
                result = call()
            except BaseException as exc:  # the engine fails the step's requests; this thread goes on
                _answer(waiting)
                waiting = None
                done.set_exception(exc)
                continue
            _answer(waiting)  # after this call's launch: the device has it queued
            waiting = None
            if isinstance(result, DeviceSample):
                waiting = (done, result)
            else:
                done.set_result(result)

    def _step(self, batch: StepBatch) -> StepResult | DeviceSample:
        previous, previous_device = self._previous, self._previous_device
        self._previous = self._previous_device = None
        if batch.placeholders:
            if previous is None and previous_device is None:
                raise PreviousStepFailed("the step before this one failed; its tokens are not there to continue from")
            if previous is not None:  # TP: the ranks get the batch as a message
                for row, source in batch.placeholders:
                    batch.input_ids[row] = previous[source]
        if self._runner is not None:
            self._runner.previous_tokens = previous_device.tokens if previous_device is not None else None
        self.inner.submit(batch)
        result = self.inner.collect()
        if batch.sampling is None or not isinstance(result, StepLogits):
            if isinstance(result, SampledTokens):
                self._previous = [token for token, _ in result.tokens]
            return result
        on_device = sample_on_device(result.sample_logits, batch.sampling)
        if self._runner is not None:
            self._previous_device = on_device
            return on_device
        sampled = SampledTokens(sampled_on_host(on_device))
        self._previous = [token for token, _ in sampled.tokens]
        return sampled


def _answer(waiting: tuple[Future, DeviceSample] | None) -> None:
    """Copy a step's tokens to the host and hand them to the engine (or the copy's error)."""
    if waiting is not None:
        done, on_device = waiting
        try:
            done.set_result(SampledTokens(sampled_on_host(on_device)))
        except BaseException as exc:
            done.set_exception(exc)
