"""Serving metrics from per-request outcomes, defined exactly as `vllm bench serve` defines them.

- TTFT: send → first streamed text chunk.
- TPOT: (E2EL − TTFT) / (output tokens − 1), for requests with more than one output token.
- ITL: every gap between consecutive text chunks, pooled over all requests.
- E2EL: send → last text chunk.
- Throughputs divide by the benchmark's wall time (first send to last finish).
- Goodput: completed requests per second that met every given SLO (a request with one
  output token counts TPOT as 0, as vLLM does).
See docs/bench.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from llmctl.bench.client import RequestOutcome
from llmctl.errors import LlmctlError

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (90.0, 99.0)


@dataclass
class Distribution:
    mean: float
    median: float
    std: float
    percentiles: dict[float, float]  # percentile → value, milliseconds

    @classmethod
    def of(cls, seconds: list[float], percentiles: tuple[float, ...]) -> Distribution:
        values = np.array(seconds or [0.0]) * 1000
        return cls(float(values.mean()), float(np.median(values)), float(values.std()),
                   {p: float(np.percentile(values, p)) for p in percentiles})


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_concurrent_requests: int
    latencies: dict[str, Distribution]  # ttft, tpot, itl, e2el
    output_lens: list[int] = field(default_factory=list)  # per request; 0 for a failed one
    errors: list[str] = field(default_factory=list)  # per request; "" for a successful one


def parse_goodput(specs: list[str]) -> dict[str, float]:
    """`ttft:200 tpot:50` → SLOs in milliseconds."""
    slos = {}
    for spec in specs:
        for item in spec.replace(",", " ").split():
            name, _, value = item.partition(":")
            if name not in ("ttft", "tpot", "e2el"):
                raise LlmctlError(f"--goodput {item}: the metric must be ttft, tpot or e2el")
            try:
                slos[name] = float(value)
            except ValueError:
                raise LlmctlError(f"--goodput {item}: give milliseconds, e.g. ttft:200") from None
            if slos[name] <= 0:
                raise LlmctlError(f"--goodput {item}: the SLO must be positive")
    return slos


def output_length(outcome: RequestOutcome, count_tokens: Callable[[str], int] | None) -> int:
    """The server's usage count; else the tokenizer's count of the streamed text; else chunks."""
    if outcome.output_tokens is not None:
        return outcome.output_tokens
    if count_tokens is not None:
        return count_tokens(outcome.generated_text)
    return len(outcome.itl) + 1


def peak_concurrency(outcomes: list[RequestOutcome]) -> int:
    """Most requests in flight at once (half-open [start, end) intervals)."""
    events = sorted([(o.start_time, 1) for o in outcomes] + [(o.start_time + o.latency, -1) for o in outcomes])
    current = peak = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def time_per_output_token(e2e: float, ttft: float, output_tokens: int) -> float:
    """TPOT: (E2EL − TTFT) / (output tokens − 1); 0 for a single output token, as vLLM counts it."""
    return (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else 0.0


def calculate_metrics(outcomes: list[RequestOutcome], duration: float, slos: dict[str, float],
                      count_tokens: Callable[[str], int] | None = None,
                      percentiles: tuple[float, ...] = DEFAULT_PERCENTILES) -> BenchmarkMetrics:
    ttfts, tpots, all_tpots, itls, e2els, output_lens = [], [], [], [], [], []
    good = 0
    for outcome in outcomes:
        if not outcome.success:
            output_lens.append(0)
            continue
        length = output_length(outcome, count_tokens)
        output_lens.append(length)
        tpot = time_per_output_token(outcome.latency, outcome.ttft, length)
        if length > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
        ttfts.append(outcome.ttft)
        itls.extend(outcome.itl)
        e2els.append(outcome.latency)
        measured = {"ttft": outcome.ttft, "tpot": tpot, "e2el": outcome.latency}
        good += all(measured[name] * 1000 <= slo for name, slo in slos.items())
    successful = [o for o in outcomes if o.success]
    total_input = sum(o.prompt_len for o in successful)
    total_output = sum(output_lens)
    return BenchmarkMetrics(
        completed=len(successful), failed=len(outcomes) - len(successful), duration=duration,
        total_input_tokens=total_input, total_output_tokens=total_output,
        request_throughput=len(successful) / duration,
        request_goodput=good / duration if slos else None,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_concurrent_requests=peak_concurrency(successful),
        latencies={name: Distribution.of(values, percentiles)
                   for name, values in zip(LATENCY_METRICS, (ttfts, tpots, itls, e2els))},
        output_lens=output_lens, errors=[o.error for o in outcomes])
