"""The driver's receiver of step results (logits) from the last pipeline stage.

A thread waits for each submitted batch's result while the driver's own stage computes the
next batch, so the transfer (a few MB of logits: ~1.6 ms a step through gloo here) is off the
driver's critical path. It receives only what was announced: an idle server posts no receive
that could time out.
"""

from __future__ import annotations

import queue
import threading

import torch.distributed as dist

from llmctl.engine.distributed.channel import recv_object


class ResultReceiver:
    def __init__(self, pg: dist.ProcessGroup, src: int) -> None:
        self._pg, self._src = pg, src
        self._expected: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._arrived: queue.SimpleQueue[object | BaseException] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="llmctl-results", daemon=True)
        self._thread.start()

    def expect(self) -> None:
        """A batch went into the pipeline: its result will come back."""
        self._expected.put(True)

    def next(self) -> object:
        """The oldest announced result; raises what the receive raised (a lost or hung rank)."""
        item = self._arrived.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._expected.put(False)

    def _loop(self) -> None:
        while self._expected.get():
            try:
                self._arrived.put(recv_object(self._pg, self._src))
            except BaseException as exc:  # handed to the driver, which fails the step
                self._arrived.put(exc)
                return
