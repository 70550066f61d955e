"""/metrics: vLLM's serving metrics under the `llmctl:` prefix, in the Prometheus text format.

Gauges and engine counters are read from the engine when scraped; latency histograms are
observed by the server as requests stream. Names and meanings: docs/serve.md.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)


class EngineCollector:
    """Reads the engine's state at scrape time (plain integer reads from the engine thread's objects)."""

    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.labels = {"model_name": model_name}

    def collect(self) -> Iterator[Any]:
        engines = self.engine()
        if not engines:
            return
        # One sample per engine; with --dp each replica is labelled, as vLLM labels engine="i".
        labelled = [({**self.labels, "engine": str(i)} if len(engines) > 1 else self.labels, e)
                    for i, e in enumerate(engines)]
        names = list(labelled[0][0])

        def family(kind: type, name: str, doc: str, read: Any) -> Any:
            metric = kind(name, doc, labels=names)
            for labels, engine in labelled:
                metric.add_metric(list(labels.values()), read(engine))
            return metric

        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield family(gauge, "llmctl:num_requests_running", "Sequences in model execution batches.",
                     lambda e: len(e.scheduler.running))
        yield family(gauge, "llmctl:num_requests_waiting", "Sequences waiting to be scheduled.",
                     lambda e: len(e.scheduler.waiting))
        yield family(gauge, "llmctl:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%).",
                     lambda e: e.block_manager.usage)
        yield family(counter, "llmctl:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                     lambda e: e.block_manager.stats.queries)
        yield family(counter, "llmctl:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                     lambda e: e.block_manager.stats.hits)
        yield family(counter, "llmctl:num_preemptions", "Sequences preempted (recomputed later) for lack of KV "
                     "blocks.", lambda e: e.scheduler.num_preemptions)
        yield family(counter, "llmctl:prompt_tokens", "Prefill tokens processed.", lambda e: e.stats["prompt_tokens"])
        yield family(counter, "llmctl:generation_tokens", "Generation tokens processed.",
                     lambda e: e.stats["generation_tokens"])
        if all(e.speculator is not None for _, e in labelled):
            yield from _spec_decode_families(family, labelled, names)
        if all(e.lora is not None for _, e in labelled):
            yield _lora_info(labelled, names)


def _lora_info(labelled: list[tuple[dict[str, str], Any]], names: list[str]) -> Any:
    """vLLM's `vllm:lora_requests_info`: the adapters running and waiting, as label values."""
    import time

    info = GaugeMetricFamily("llmctl:lora_requests_info", "Running stats on LoRA requests.",
                             labels=names + ["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    for labels, engine in labelled:
        def adapters(seqs: Any) -> str:
            seqs = tuple(seqs)  # one copy in C: the engine thread may change the queue meanwhile
            return ",".join(sorted({s.lora.name for s in seqs if s.lora is not None}))

        info.add_metric(list(labels.values()) + [str(engine.config.max_loras), adapters(engine.scheduler.running),
                                                 adapters(engine.scheduler.waiting)], time.time())
    return info


def _spec_decode_families(family: Any, labelled: list[tuple[dict[str, str], Any]], names: list[str]) -> Iterator[Any]:
    """Speculative decoding's counters under vLLM's names (`vllm:spec_decode_…`)."""
    counter = CounterMetricFamily
    yield family(counter, "llmctl:spec_decode_num_drafts", "Verified proposals (one per sequence and step).",
                 lambda e: e.speculator.stats.num_drafts)
    yield family(counter, "llmctl:spec_decode_num_draft_tokens", "Proposed tokens verified.",
                 lambda e: e.speculator.stats.num_draft_tokens)
    yield family(counter, "llmctl:spec_decode_num_accepted_tokens", "Proposed tokens accepted.",
                 lambda e: e.speculator.stats.num_accepted_tokens)
    per_position = counter("llmctl:spec_decode_num_accepted_tokens_per_pos",
                           "Proposed tokens accepted, by position in the proposal.", labels=names + ["position"])
    for labels, engine in labelled:
        for position, count in enumerate(engine.speculator.stats.accepted_per_position):
            per_position.add_metric(list(labels.values()) + [str(position)], count)
    yield per_position


class ServerMetrics:
    def __init__(self, engine_getter: Any, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine_getter, model_name))
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
