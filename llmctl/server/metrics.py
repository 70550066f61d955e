"""/metrics: vLLM's serving metrics under the `llmctl:` prefix (`--metrics-prefix vllm`: under vLLM's own,
with the older names vLLM's Grafana dashboard still reads), in the Prometheus text format.

Gauges and engine counters are read from the engine when scraped; latency histograms are
observed by the server as requests stream. Names and meanings: docs/serve.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from llmctl.engine.front.outputs import RequestMetrics, RequestOutput
from llmctl.engine.front.stats import EngineStats, OffloadCounts, SpecDecodeCounts

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)
# vLLM's request_latency_buckets, for the phases of a request (queue, prefill, decode, inference)
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
# vLLM's 1-2-5 buckets for token counts (it stops them at max_model_len, which may not be known when the port opens)
TOKEN_BUCKETS = tuple(m * 10 ** e for e in range(7) for m in (1, 2, 5))
PREFIXES = ("llmctl", "vllm")


StatsFamily = Callable[[type, str, str, Callable[[EngineStats], float]], Any]


class EngineCollector:
    """Reads each engine replica's stats snapshot at scrape time."""

    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str, prefix: str = "llmctl") -> None:
        self.read_stats = read_stats
        self.labels = {"model_name": model_name}
        self.prefix = prefix

    def collect(self) -> Iterator[Any]:
        replicas = self.read_stats()
        if not replicas:
            return
        # One sample per engine; with --dp each replica is labelled, as vLLM labels engine="i".
        labelled = [({**self.labels, "engine": str(i)} if len(replicas) > 1 else self.labels, stats)
                    for i, stats in enumerate(replicas)]
        names = list(labelled[0][0])

        def family(kind: type, name: str, doc: str, read: Callable[[EngineStats], float]) -> Any:
            metric = kind(f"{self.prefix}:{name}", doc, labels=names)
            for labels, stats in labelled:
                metric.add_metric(list(labels.values()), read(stats))
            return metric

        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        yield family(gauge, "num_requests_running", "Sequences in model execution batches.",
                     lambda s: s.num_running)
        yield family(gauge, "num_requests_waiting", "Sequences waiting to be scheduled.",
                     lambda s: s.num_waiting)
        yield family(gauge, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%).",
                     lambda s: s.kv_cache_usage)
        if self.prefix == "vllm":  # the name vLLM's Grafana dashboard still reads (vLLM v0's)
            yield family(gauge, "gpu_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%); the "
                         "older name of kv_cache_usage_perc.", lambda s: s.kv_cache_usage)
        yield family(counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                     lambda s: s.prefix_cache_queries)
        yield family(counter, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                     lambda s: s.prefix_cache_hits)
        yield family(counter, "num_preemptions", "Sequences preempted (recomputed later) for lack of KV "
                     "blocks.", lambda s: s.num_preemptions)
        yield family(counter, "prompt_tokens", "Prefill tokens processed.", lambda s: s.prompt_tokens)
        yield family(counter, "generation_tokens", "Generation tokens processed.",
                     lambda s: s.generation_tokens)
        if all(s.offload is not None for _, s in labelled):
            yield from _offload_families(family)
        if all(s.spec_decode is not None for _, s in labelled):
            yield from _spec_decode_families(family, labelled, names, self.prefix)
        if all(s.max_loras for _, s in labelled):
            yield _lora_info(labelled, names, self.prefix)


def _lora_info(labelled: list[tuple[dict[str, str], EngineStats]], names: list[str], prefix: str) -> Any:
    """vLLM's `vllm:lora_requests_info`: the adapters running and waiting, as label values."""
    info = GaugeMetricFamily(f"{prefix}:lora_requests_info", "Running stats on LoRA requests.",
                             labels=names + ["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    for labels, stats in labelled:
        info.add_metric(list(labels.values()) + [str(stats.max_loras), ",".join(stats.running_adapters),
                                                 ",".join(stats.waiting_adapters)], time.time())
    return info


def _spec_decode_families(family: StatsFamily, labelled: list[tuple[dict[str, str], EngineStats]],
                          names: list[str], prefix: str) -> Iterator[Any]:
    """Speculative decoding's counters under vLLM's names (`vllm:spec_decode_…`); every replica speculates."""
    counter = CounterMetricFamily
    yield family(counter, "spec_decode_num_drafts", "Verified proposals (one per sequence and step).",
                 lambda s: _spec_counts(s).num_drafts)
    yield family(counter, "spec_decode_num_draft_tokens", "Proposed tokens verified.",
                 lambda s: _spec_counts(s).num_draft_tokens)
    yield family(counter, "spec_decode_num_accepted_tokens", "Proposed tokens accepted.",
                 lambda s: _spec_counts(s).num_accepted_tokens)
    per_position = counter(f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
                           "Proposed tokens accepted, by position in the proposal.", labels=names + ["position"])
    for labels, stats in labelled:
        for position, count in enumerate(_spec_counts(stats).accepted_per_position):
            per_position.add_metric(list(labels.values()) + [str(position)], count)
    yield per_position


def _offload_families(family: StatsFamily) -> Iterator[Any]:
    """The KV cache's CPU tier (--kv-offloading-size), under vLLM's names; every replica has one."""
    counter = CounterMetricFamily
    yield family(counter, "external_prefix_cache_queries", "Prompt tokens looked up in the KV cache's CPU tier.",
                 lambda s: _offload(s).queries)
    yield family(counter, "external_prefix_cache_hits", "Prompt tokens loaded from the KV cache's CPU tier.",
                 lambda s: _offload(s).hits)
    yield family(counter, "kv_offload_store_bytes", "Bytes of KV blocks copied to the CPU tier.",
                 lambda s: _offload(s).store_bytes)
    yield family(counter, "kv_offload_load_bytes", "Bytes of KV blocks loaded back from the CPU tier.",
                 lambda s: _offload(s).load_bytes)


def _offload(stats: EngineStats) -> OffloadCounts:
    assert stats.offload is not None, "the collector yields these families only when every replica has a tier"
    return stats.offload


def _spec_counts(stats: EngineStats) -> SpecDecodeCounts:
    assert stats.spec_decode is not None, "the collector yields these families only when every replica speculates"
    return stats.spec_decode


class ServerMetrics:
    def __init__(self, read_stats: Callable[[], list[EngineStats]], model_name: str, prefix: str = "llmctl") -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(read_stats, model_name, prefix))
        self.model_name, self.prefix = model_name, prefix

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"{prefix}:{name}", doc, ["model_name"], buckets=buckets, registry=self.registry)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", LATENCY_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between consecutive output tokens.", LATENCY_BUCKETS)
        # vLLM v0's name for the same observations, which vLLM's Grafana dashboard reads
        self.tpot = histogram("time_per_output_token_seconds", "Time between consecutive output tokens (the older "
                              "name of inter_token_latency_seconds).", LATENCY_BUCKETS) if prefix == "vllm" else None
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.", LATENCY_BUCKETS)
        self.phases = {phase: histogram(f"request_{phase}_time_seconds", doc, PHASE_BUCKETS) for phase, doc in (
            ("queue", "Time from arrival to first scheduled."), ("prefill", "Time from first scheduled to first token."),
            ("decode", "Time from first token to last token."), ("inference", "Time from first scheduled to last token."))}
        self.token_counts = {name: histogram(f"request_{name}", doc, TOKEN_BUCKETS) for name, doc in (
            ("prompt_tokens", "Prompt tokens of finished requests."),
            ("generation_tokens", "Generated tokens of finished requests (all choices)."),
            ("max_num_generation_tokens", "The longest choice's generated tokens, per finished request."))}
        self.success = Counter(f"{prefix}:request_success", "Finished choices (n per request) by finish reason.",
                               ["model_name", "finished_reason"], registry=self.registry)
        self.lora_requests = Counter(f"{prefix}:lora_requests", "Requests received for each LoRA adapter.",
                                     ["model_name", "lora_name"], registry=self.registry)

    def observe_finished(self, output: RequestOutput, m: RequestMetrics, token_times: list[float]) -> None:
        """A finished request's latencies (`m`: its metrics) and token counts."""
        name = self.model_name
        if m.ttft is not None:
            self.ttft.labels(name).observe(m.ttft)
        for before, after in zip(token_times, token_times[1:]):
            for histogram in (self.itl, self.tpot):
                if histogram is not None:
                    histogram.labels(name).observe(after - before)
        if m.e2e is not None:
            self.e2e.labels(name).observe(m.e2e)
        for phase, (start, end) in (("queue", (m.arrival_time, m.first_scheduled_time)),
                                    ("prefill", (m.first_scheduled_time, m.first_token_time)),
                                    ("decode", (m.first_token_time, m.last_token_time)),
                                    ("inference", (m.first_scheduled_time, m.last_token_time))):
            if start is not None and end is not None:
                self.phases[phase].labels(name).observe(max(0.0, end - start))
        generated = [len(choice.token_ids) for choice in output.outputs]
        for key, count in (("prompt_tokens", len(output.prompt_token_ids or [])),
                           ("generation_tokens", sum(generated)), ("max_num_generation_tokens", max(generated, default=0))):
            self.token_counts[key].labels(name).observe(count)
        for choice in output.outputs:
            self.success.labels(name, choice.finish_reason or "abort").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
