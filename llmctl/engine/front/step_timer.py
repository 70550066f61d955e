"""--collect-detailed-traces: each model step's time added to the sequences it ran, for their trace spans
(llmctl.engine.front.tracing) — "model": the forward pass (the GPU synchronized after it, which costs speed: why
it is opt-in, as in vLLM), "worker": from the step's submission to its sampled tokens."""

from __future__ import annotations

import time

import torch

from llmctl.engine.core.scheduler import SchedulerOutput


class StepTimer:
    def __init__(self, detail: tuple[str, ...], device: torch.device) -> None:
        self.forward = "model" in detail or "all" in detail
        self.execute = "worker" in detail or "all" in detail
        self._device = device

    def forward_done(self, sched: SchedulerOutput, started: float) -> None:
        """After the executor took the step (`started`: before): its forward pass, when collected."""
        if not self.forward:
            return
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        _add(sched, "model_forward", time.perf_counter() - started)

    def executed(self, sched: SchedulerOutput) -> None:
        """After the step's tokens were sampled: its time since submission, when collected."""
        if self.execute:
            _add(sched, "model_execute", time.perf_counter() - sched.submitted_at)


def _add(sched: SchedulerOutput, timing: str, seconds: float) -> None:
    for item in sched.scheduled:
        timings = item.seq.timings
        setattr(timings, timing, (getattr(timings, timing) or 0.0) + seconds)
