"""/metrics: vLLM's serving metrics under the `llmctl:` prefix, in the Prometheus text format.

Gauges and engine counters are read from the engine when scraped; latency histograms are
observed by the server as requests stream. Names and meanings: docs/serve.md.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llmctl.engine.front.stats import EngineStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)


StatsFamily = Callable[[type, str, str, Callable[[EngineStats], float]], Any]


class EngineCollector:
    """Reads each engine replica's stats snapshot at scrape time."""

    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str) -> None:
        self.read_stats = read_stats
        self.labels = {"model_name": model_name}

    def collect(self) -> Iterator[Any]:
        replicas = self.read_stats()
        if not replicas:
            return
        # One sample per engine; with --dp each replica is labelled, as vLLM labels engine="i".
        labelled = [({**self.labels, "engine": str(i)} if len(replicas) > 1 else self.labels, stats)
                    for i, stats in enumerate(replicas)]
        names = list(labelled[0][0])

        def family(kind: type, name: str, doc: str, read: Callable[[EngineStats], float]) -> Any:
            metric = kind(name, doc, labels=names)
            for labels, stats in labelled:
                metric.add_metric(list(labels.values()), read(stats))
            return metric

        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield family(gauge, "llmctl:num_requests_running", "Sequences in model execution batches.",
                     lambda s: s.num_running)
        yield family(gauge, "llmctl:num_requests_waiting", "Sequences waiting to be scheduled.",
                     lambda s: s.num_waiting)
        yield family(gauge, "llmctl:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%).",
                     lambda s: s.kv_cache_usage)
        yield family(counter, "llmctl:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                     lambda s: s.prefix_cache_queries)
        yield family(counter, "llmctl:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                     lambda s: s.prefix_cache_hits)
        yield family(counter, "llmctl:num_preemptions", "Sequences preempted (recomputed later) for lack of KV "
                     "blocks.", lambda s: s.num_preemptions)
        yield family(counter, "llmctl:prompt_tokens", "Prefill tokens processed.", lambda s: s.prompt_tokens)
        yield family(counter, "llmctl:generation_tokens", "Generation tokens processed.",
                     lambda s: s.generation_tokens)
        if all(s.spec_decode is not None for _, s in labelled):
            yield from _spec_decode_families(family, labelled, names)
        if all(s.max_loras for _, s in labelled):
            yield _lora_info(labelled, names)


def _lora_info(labelled: list[tuple[dict[str, str], EngineStats]], names: list[str]) -> Any:
    """vLLM's `vllm:lora_requests_info`: the adapters running and waiting, as label values."""
    info = GaugeMetricFamily("llmctl:lora_requests_info", "Running stats on LoRA requests.",
                             labels=names + ["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    for labels, stats in labelled:
        info.add_metric(list(labels.values()) + [str(stats.max_loras), ",".join(stats.running_adapters),
                                                 ",".join(stats.waiting_adapters)], time.time())
    return info


def _spec_decode_families(family: StatsFamily, labelled: list[tuple[dict[str, str], EngineStats]],
                          names: list[str]) -> Iterator[Any]:
    """Speculative decoding's counters under vLLM's names (`vllm:spec_decode_…`)."""
    counter = CounterMetricFamily
    yield family(counter, "llmctl:spec_decode_num_drafts", "Verified proposals (one per sequence and step).",
                 lambda s: s.spec_decode.num_drafts)
    yield family(counter, "llmctl:spec_decode_num_draft_tokens", "Proposed tokens verified.",
                 lambda s: s.spec_decode.num_draft_tokens)
    yield family(counter, "llmctl:spec_decode_num_accepted_tokens", "Proposed tokens accepted.",
                 lambda s: s.spec_decode.num_accepted_tokens)
    per_position = counter("llmctl:spec_decode_num_accepted_tokens_per_pos",
                           "Proposed tokens accepted, by position in the proposal.", labels=names + ["position"])
    for labels, stats in labelled:
        for position, count in enumerate(stats.spec_decode.accepted_per_position):
            per_position.add_metric(list(labels.values()) + [str(position)], count)
    yield per_position


class ServerMetrics:
    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(read_stats, model_name))
        labels = ["model_name"]
        self.model_name = model_name
        self.ttft = Histogram("llmctl:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("llmctl:inter_token_latency_seconds", "Time between consecutive output tokens.", labels,
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("llmctl:e2e_request_latency_seconds", "End-to-end request latency.", labels,
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.success = Counter("llmctl:request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=self.registry)
        self.lora_requests = Counter("llmctl:lora_requests", "Requests received for each LoRA adapter.",
                                     labels + ["lora_name"], registry=self.registry)

    def observe_finished(self, ttft: float | None, token_times: list[float], e2e: float | None,
                         reasons: list[str]) -> None:
        name = self.model_name
        if ttft is not None:
            self.ttft.labels(name).observe(ttft)
        for before, after in zip(token_times, token_times[1:]):
            self.itl.labels(name).observe(after - before)
        if e2e is not None:
            self.e2e.labels(name).observe(e2e)
        for reason in reasons:
            self.success.labels(name, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
