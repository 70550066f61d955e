"""The load generator: send requests at Poisson (or gamma) arrival times under a concurrency cap.

Arrival gaps follow vLLM: gamma with shape `burstiness` and mean 1/rate (burstiness 1 is
Poisson), rescaled so the last request goes out at num_prompts / rate; rate inf sends
everything at once. `max_concurrency` holds requests back while that many are in flight.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx2
import numpy as np

from llmctl.bench.client import RequestOutcome, RequestSettings, send_request
from llmctl.bench.datasets import SampleRequest
from llmctl.bench.server_metrics import ServerStats, ServerStatsRecorder
from llmctl.errors import LlmctlError


@dataclass(frozen=True)
class LoadPoint:
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def label(self) -> str:
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
        cap = f", max concurrency {self.max_concurrency}" if self.max_concurrency else ""
        return f"request rate {rate}/s{cap}"


@dataclass
class LoadResult:
    point: LoadPoint
    outcomes: list[RequestOutcome]
    duration: float
    server: ServerStats | None


def arrival_offsets(count: int, point: LoadPoint, seed: int) -> list[float]:
    """Seconds after the start at which each request is sent."""
    if point.request_rate <= 0 or point.burstiness <= 0:
        raise LlmctlError("--request-rate and --burstiness must be positive")
    if math.isinf(point.request_rate):
        return [0.0] * count
    rng = np.random.default_rng(seed)
    scale = 1.0 / (point.request_rate * point.burstiness)
    gaps = rng.gamma(shape=point.burstiness, scale=scale, size=count)
    offsets = np.cumsum(gaps)
    offsets *= (count / point.request_rate) / offsets[-1]  # vLLM's normalization: steadier throughput
    return [float(x) for x in offsets]


async def run_load(requests: list[SampleRequest], settings: RequestSettings, point: LoadPoint, *, seed: int = 0,
                   num_warmups: int = 0, on_done: Callable[[RequestOutcome], None] | None = None) -> LoadResult:
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=point.max_concurrency or 100)
    async with httpx2.AsyncClient(limits=limits, timeout=settings.timeout_s) as client:
        for warmup in requests[:num_warmups]:  # not measured: first-request costs (lazy init, caches)
            await send_request(client, warmup, settings)
        recorder = ServerStatsRecorder(client, settings.base_url, settings.headers)
        await recorder.start()
        gate = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
        offsets = arrival_offsets(len(requests), point, seed)
        started = time.perf_counter()

        async def one(request: SampleRequest, offset: float) -> RequestOutcome:
            await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
            if gate is None:
                outcome = await send_request(client, request, settings)
            else:
                async with gate:
                    outcome = await send_request(client, request, settings)
            if on_done:
                on_done(outcome)
            return outcome

        outcomes = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets)))
        duration = time.perf_counter() - started
        server = await recorder.stop()
    return LoadResult(point, list(outcomes), duration, server)
