"""`llmctl bench serve`: pick the model and tokenizer, build the workload, run every load point."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2

from llmctl.bench.client import RequestOutcome, RequestSettings
from llmctl.bench.datasets import DatasetOptions, SampleRequest, sample_requests
from llmctl.bench.endpoint import Endpoint, resolve_endpoint
from llmctl.bench.load import LoadPoint, LoadResult, run_load
from llmctl.bench.metrics import LATENCY_METRICS, BenchmarkMetrics, calculate_metrics
from llmctl.bench.tokens import LocalTokenizer, ServerTokenizer, TokenCounter, load_local_tokenizer
from llmctl.errors import LlmctlError


@dataclass
class ServeBenchOptions:
    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None
    tokenizer: str | None = None
    endpoint: Endpoint = field(default_factory=lambda: resolve_endpoint(None, None))
    api_key: str | None = None
    dataset: DatasetOptions = field(default_factory=DatasetOptions)
    request_rates: list[float] = field(default_factory=lambda: [math.inf])
    burstiness: float = 1.0
    max_concurrencies: list[int | None] = field(default_factory=lambda: [None])
    num_warmups: int = 0
    goodput: dict[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (90.0, 99.0)
    ignore_eos: bool = False
    temperature: float | None = None
    sampling: dict[str, float] = field(default_factory=dict)
    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    ready_check_timeout_s: float = 600


@dataclass
class PointResult:
    load: LoadResult
    metrics: BenchmarkMetrics


@dataclass
class ServeBenchRun:
    model: str
    tokenizer: str
    requests: list[SampleRequest]
    points: list[PointResult]
    warnings: list[str]
    reported_metrics: tuple[str, ...] = LATENCY_METRICS  # --percentile-metrics: which latencies to report


def parse_list(text: str, what: str, parse: Callable[[str], float | int]) -> list:
    try:
        values = [parse(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError:
        raise LlmctlError(f"{what} takes a number or a comma-separated list, e.g. 1,2,4,inf; got {text!r}") from None
    if not values:
        raise LlmctlError(f"{what} is empty")
    return values


def parse_rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def parse_concurrency(text: str) -> int | None:
    if text.lower() in ("none", "inf"):
        return None
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def first_server_model(base_url: str, headers: dict[str, str], ready_timeout_s: float) -> str:
    """The first model of /v1/models, waiting up to `ready_timeout_s` while the server starts (503 or refused)."""
    url = f"{base_url}/v1/models"
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            response = httpx2.get(url, headers=headers, timeout=30)
            reason = f"answered {response.status_code}"
        except httpx2.HTTPError as error:
            response, reason = None, f"is unreachable ({type(error).__name__})"
        if response is not None and response.status_code not in (502, 503, 504):
            break
        if time.monotonic() >= deadline:
            raise LlmctlError(f"{url} {reason} after {ready_timeout_s:g} s; is the server running? "
                              f"Start one with `llmctl serve`, or pass --base-url") from None
        time.sleep(1)
    if response.status_code == 401:
        raise LlmctlError(f"{url} refused the request (401): pass --api-key")
    if response.status_code != 200:
        raise LlmctlError(f"{url} answered {response.status_code}; pass --model NAME")
    models = response.json().get("data") or []
    if not models:
        raise LlmctlError(f"{url} lists no models; pass --model NAME")
    return models[0]["id"]


def choose_tokenizer(options: ServeBenchOptions, model: str, headers: dict[str, str],
                     warnings: list[str]) -> tuple[TokenCounter, LocalTokenizer]:
    """(the counter of prompt lengths, a local tokenizer that supplies the words)."""
    wanted = options.tokenizer or model
    try:
        local = load_local_tokenizer(wanted)
        return local, local
    except LlmctlError as error:
        reason = str(error)
    fallback = load_local_tokenizer(None)
    server = ServerTokenizer(f"the server's /tokenize ({model})", options.base_url, model, headers)
    try:
        server.encode("hello")
    except (LlmctlError, httpx2.HTTPError, ValueError, KeyError):
        warnings.append(f"cannot load the tokenizer {wanted!r} ({reason}) and the server has no /tokenize: "
                        f"token lengths are counted with the default model's tokenizer ({fallback.name}); "
                        f"pass --tokenizer to count them right")
        return fallback, fallback
    warnings.append(f"cannot load the tokenizer {wanted!r} ({reason}): counting tokens with the server's /tokenize")
    return server, fallback


def run_serve_bench(options: ServeBenchOptions,
                    on_point: Callable[[LoadPoint, int], Callable[[RequestOutcome], None]] | None = None,
                    on_warning: Callable[[str], None] | None = None) -> ServeBenchRun:
    base_url = options.base_url.rstrip("/")
    options = dataclasses.replace(options, base_url=base_url[:-3] if base_url.endswith("/v1") else base_url)
    settings = RequestSettings(options.base_url, "", options.endpoint, options.api_key, options.ignore_eos,
                               options.temperature, options.sampling)
    settings.model = options.model or first_server_model(options.base_url, settings.headers,
                                                         options.ready_check_timeout_s)
    model = settings.model
    warnings: list[str] = []
    counter, words_from = choose_tokenizer(options, model, settings.headers, warnings)
    for warning in warnings:
        if on_warning:
            on_warning(warning)
    requests = sample_requests(options.dataset, counter, words_from.words())
    if any(request.images for request in requests) and not options.endpoint.is_chat:  # nor to embeddings or rerank
        raise LlmctlError("random-mm's images go to the chat endpoint: add --endpoint /v1/chat/completions "
                          "(or --backend openai-chat)")
    points = []
    for rate, cap in itertools.product(options.request_rates, options.max_concurrencies):
        point = LoadPoint(rate, options.burstiness, cap)
        on_done = on_point(point, len(requests)) if on_point else None
        load = asyncio.run(run_load(requests, settings, point, seed=options.dataset.seed,
                                    num_warmups=options.num_warmups, on_done=on_done))
        metrics = calculate_metrics(load.outcomes, load.duration, options.goodput,
                                    lambda text: len(counter.encode(text)), options.percentiles)
        points.append(PointResult(load, metrics))
    reported = ("e2el",) if options.endpoint.is_pooling else options.percentile_metrics  # nothing streams
    return ServeBenchRun(model, counter.name, requests, points, warnings, reported)
