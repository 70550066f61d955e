"""OpenTelemetry spans per finished request, as vLLM exports them (--otlp-traces-endpoint): one SERVER span
"llm_request" from the request's arrival to its end, vLLM's gen_ai.* attribute names, the trace continued from the
request's W3C `traceparent`. The exporter is OTLP over gRPC, or over HTTP with
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (vLLM's variable and default); spans leave in batches
(OTEL_BSP_SCHEDULE_DELAY). opentelemetry-sdk and the exporters are the optional extra llmctl[otel]."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from llmctl.engine.errors import EngineConfigError

if TYPE_CHECKING:  # the engine's config validates tracing settings here, in commands that import no torch
    from llmctl.engine.front.outputs import RequestMetrics, RequestOutput
    from llmctl.engine.sampling_params import SamplingParams

logger = logging.getLogger("llmctl.engine")
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context, read from a request's headers
DETAIL_CHOICES = ("model", "worker", "all")  # vLLM's --collect-detailed-traces
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
INSTALL_HINT = "pip install 'llmctl[otel]' (opentelemetry-sdk and its OTLP exporters)"


class SpanAttributes:
    """vLLM's names (vllm/tracing.py): the GenAI semantic conventions' where they exist, gen_ai.latency.* its own."""
    USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    REQUEST_TOP_P = "gen_ai.request.top_p"
    REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    RESPONSE_MODEL = "gen_ai.response.model"
    REQUEST_ID = "gen_ai.request.id"
    REQUEST_N = "gen_ai.request.n"
    LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    LATENCY_E2E = "gen_ai.latency.e2e"
    LATENCY_TIME_IN_MODEL_FORWARD = "gen_ai.latency.time_in_model_forward"
    LATENCY_TIME_IN_MODEL_EXECUTE = "gen_ai.latency.time_in_model_execute"
    LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"


def parse_detailed_traces(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """vLLM's --collect-detailed-traces: model, worker or all, comma-separated or a list."""
    if value is None:
        return ()
    parts = value.split(",") if isinstance(value, str) else list(value)
    choices = tuple(part.strip() for part in parts if part.strip())
    unknown = [choice for choice in choices if choice not in DETAIL_CHOICES]
    if unknown or not choices:
        raise EngineConfigError(f"--collect-detailed-traces {value!r}: give one or more of {', '.join(DETAIL_CHOICES)}"
                                " (comma-separated)")
    return choices


def check_tracing_available() -> None:
    """Fails at startup, before any loading, when the SDK or the configured exporter is missing."""
    protocol = os.environ.get(PROTOCOL_ENV, "grpc")
    if protocol not in ("grpc", "http/protobuf"):
        raise EngineConfigError(f"{PROTOCOL_ENV}={protocol!r}: llmctl exports traces over grpc (the default) or "
                                "http/protobuf")
    try:
        _exporter_class(protocol)
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise EngineConfigError(f"--otlp-traces-endpoint needs OpenTelemetry ({exc.name} is not installed): "
                                f"{INSTALL_HINT}") from None


def _exporter_class(protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    return HttpExporter


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C Trace Context headers among a request's (starlette's headers match names in any case)."""
    return {name: headers[name] for name in TRACE_HEADERS if name in headers}


class RequestTracer:
    """One span per finished request, exported to `endpoint` in the background (BatchSpanProcessor)."""

    def __init__(self, endpoint: str, model_name: str) -> None:
        check_tracing_available()
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.model_name = model_name
        self._provider = TracerProvider(resource=Resource.create(
            {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "llmctl")}))
        exporter = _exporter_class(os.environ.get(PROTOCOL_ENV, "grpc"))(endpoint=endpoint)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("llmctl")
        self._propagator = TraceContextTextMapPropagator()
        logger.info("tracing: one span per request to %s (%s)", endpoint, os.environ.get(PROTOCOL_ENV, "grpc"))

    def record(self, output: RequestOutput, params: SamplingParams | None,
               headers: Mapping[str, str] | None = None) -> None:
        """The span of a finished request; `headers`: its traceparent/tracestate, when it came with them."""
        metrics = output.metrics
        if metrics is None:
            return
        from opentelemetry.trace import SpanKind
        context = self._propagator.extract(dict(headers or {}))
        span = self._tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER,
                                       start_time=_epoch_ns(metrics.arrival_time))
        span.set_attributes(request_attributes(output, metrics, params, self.model_name))
        span.end(end_time=_epoch_ns(metrics.finished_time or time.perf_counter()))

    def shutdown(self) -> None:
        """Export what is still batched, then stop."""
        self._provider.shutdown()


def request_attributes(output: RequestOutput, m: RequestMetrics, params: SamplingParams | None,
                       model_name: str) -> dict[str, Any]:
    """vLLM's span attributes: usage, latencies (seconds) and the sampling parameters that were set."""
    a = SpanAttributes
    attributes: dict[str, Any] = {
        a.REQUEST_ID: output.request_id, a.RESPONSE_MODEL: model_name,
        a.USAGE_PROMPT_TOKENS: len(output.prompt_token_ids or []),
        a.USAGE_COMPLETION_TOKENS: sum(len(choice.token_ids) for choice in output.outputs),
    }
    for name, (start, end) in {a.LATENCY_TIME_TO_FIRST_TOKEN: (m.arrival_time, m.first_token_time),
                               a.LATENCY_E2E: (m.arrival_time, m.finished_time),
                               a.LATENCY_TIME_IN_QUEUE: (m.arrival_time, m.first_scheduled_time),
                               a.LATENCY_TIME_IN_MODEL_PREFILL: (m.first_scheduled_time, m.first_token_time),
                               a.LATENCY_TIME_IN_MODEL_DECODE: (m.first_token_time, m.last_token_time),
                               a.LATENCY_TIME_IN_MODEL_INFERENCE: (m.first_scheduled_time, m.last_token_time)}.items():
        if start is not None and end is not None:
            attributes[name] = max(0.0, end - start)
    for name, seconds in ((a.LATENCY_TIME_IN_MODEL_FORWARD, m.model_forward_time),
                          (a.LATENCY_TIME_IN_MODEL_EXECUTE, m.model_execute_time)):
        if seconds is not None:  # --collect-detailed-traces
            attributes[name] = seconds
    if params is not None:
        for name, value in ((a.REQUEST_TOP_P, params.top_p), (a.REQUEST_MAX_TOKENS, params.max_tokens),
                            (a.REQUEST_TEMPERATURE, params.temperature), (a.REQUEST_N, params.n)):
            if value is not None:
                attributes[name] = value
    return attributes


def _epoch_ns(perf_seconds: float) -> int:
    """A time.perf_counter() reading (the engine's clock) as nanoseconds since the epoch (OpenTelemetry's)."""
    return time.time_ns() - int((time.perf_counter() - perf_seconds) * 1e9)
