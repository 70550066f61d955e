"""What the server says about itself during a run, from its Prometheus /metrics.

vLLM exports `vllm:…` and llmctl serve `llmctl:…` under the same names, so one reader
serves both: KV-cache usage is sampled while the run goes (peak and mean), preemptions
and prefix-cache hits are counter deltas between the start and the end of the run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from llmctl.engine.spec_decode.stats import SpecDecodeStats

KV_USAGE = ("kv_cache_usage_perc", "gpu_cache_usage_perc")  # vLLM v1 name, then the older one
SAMPLE_INTERVAL_S = 1.0  # often enough for a peak; rarer scrapes perturb a busy server less


@dataclass
class ServerStats:
    kv_cache_usage_peak: float | None  # fraction, 1.0 = every block in use
    kv_cache_usage_mean: float | None
    preemptions: int | None
    prefix_cache_queries: int | None
    prefix_cache_hits: int | None
    spec_decode: SpecDecodeStats | None = None  # when the server speculates (vLLM's spec_decode_* counters)

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name without its `vllm:`/`llmctl:` prefix → value summed over label sets."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.split(":", 1)[-1]
            values[name] = values.get(name, 0.0) + sample.value
    return values


async def scrape(client: httpx2.AsyncClient, base_url: str, headers: dict[str, str]) -> dict[str, float] | None:
    try:
        response = await client.get(f"{base_url}/metrics", headers=headers, timeout=10)
        if response.status_code != 200:
            return None
        return parse_metrics(response.text)
    except (httpx2.HTTPError, ValueError):
        return None


class ServerStatsRecorder:
    """Scrapes before, during (for the KV gauge) and after a run."""

    def __init__(self, client: httpx2.AsyncClient, base_url: str, headers: dict[str, str]) -> None:
        self.client, self.base_url, self.headers = client, base_url, headers
        self.before: dict[str, float] | None = None
        self.usage: list[float] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.before = await scrape(self.client, self.base_url, self.headers)
        if self.before is not None:
            self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            values = await scrape(self.client, self.base_url, self.headers)
            usage = _first(values or {}, KV_USAGE)
            if usage is not None:
                self.usage.append(usage)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    async def stop(self) -> ServerStats | None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        after = await scrape(self.client, self.base_url, self.headers) if self.before is not None else None
        if self.before is None or after is None:
            return None
        return ServerStats(
            kv_cache_usage_peak=max(self.usage) if self.usage else None,
            kv_cache_usage_mean=sum(self.usage) / len(self.usage) if self.usage else None,
            preemptions=_delta(self.before, after, "num_preemptions_total"),
            prefix_cache_queries=_delta(self.before, after, "prefix_cache_queries_total"),
            prefix_cache_hits=_delta(self.before, after, "prefix_cache_hits_total"),
            spec_decode=_spec_decode(self.before, after))


def _spec_decode(before: dict[str, float], after: dict[str, float]) -> SpecDecodeStats | None:
    drafts = _delta(before, after, "spec_decode_num_drafts_total")
    if drafts is None:
        return None
    return SpecDecodeStats(0, num_drafts=drafts,
                           num_draft_tokens=_delta(before, after, "spec_decode_num_draft_tokens_total") or 0,
                           num_accepted_tokens=_delta(before, after, "spec_decode_num_accepted_tokens_total") or 0)


def _first(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((values[name] for name in names if name in values), None)


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> int | None:
    if name not in before or name not in after:
        return None
    return int(after[name] - before[name])
