"""vLLM's --otlp-traces-endpoint through `llmctl serve` (a tiny random Llama), exporting over OTLP/HTTP to a
collector the test runs (opentelemetry-proto decodes what arrives): one `llm_request` SERVER span per request,
continuing the trace of an incoming W3C traceparent, with vLLM's gen_ai.* attributes equal to what the response
says (request id, token counts from its usage, sampling parameters) and latencies that fit together; with
--collect-detailed-traces all, the forward-pass and execute times too."""

from __future__ import annotations

import httpx
import pytest

from helpers.models import save_random_model, small_config
from helpers.otlp_collector import HttpCollector, attributes
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def collector():
    collector = HttpCollector()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer, collector):
    folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path_factory.mktemp("otel") / "m", tokenizer)
    server = start_server(str(folder), "--served-model-name", "tiny", "--max-model-len", "128",
                          "--otlp-traces-endpoint", collector.endpoint, "--collect-detailed-traces", "all",
                          env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "50"})
    yield server
    server.stop()


def test_one_span_per_request_with_the_callers_trace_and_vllms_attributes(server, collector):
    traced = httpx.post(f"{server.url}/v1/chat/completions", headers={
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01", "X-Request-Id": "traced"}, json={
        "model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
        "temperature": 0.5, "top_p": 0.9}, timeout=60).json()
    plain = httpx.post(f"{server.url}/v1/completions", json={
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": 4, "n": 2, "temperature": 1.0},
        timeout=60).json()
    spans = collector.wait_for(2)
    assert len(spans) == 2 and collector.service_names == {"llmctl"}
    by_kind = {attributes(span)["gen_ai.request.n"]: span for span in spans}
    chat, completion = by_kind[1], by_kind[2]

    assert chat.name == "llm_request" and chat.kind == chat.SPAN_KIND_SERVER
    assert chat.trace_id.hex() == TRACE_ID and chat.parent_span_id.hex() == PARENT_ID
    assert completion.trace_id.hex() != TRACE_ID and not completion.parent_span_id  # a trace of its own
    for span, body, params in ((chat, traced, {"top_p": 0.9, "temperature": 0.5, "max_tokens": 6}),
                               (completion, plain, {"temperature": 1.0, "max_tokens": 4})):
        seen = attributes(span)
        assert seen["gen_ai.request.id"].startswith(body["id"] + "-")  # the engine's id: the response's, numbered
        assert seen["gen_ai.response.model"] == "tiny"
        assert seen["gen_ai.usage.prompt_tokens"] == body["usage"]["prompt_tokens"]
        assert seen["gen_ai.usage.completion_tokens"] == body["usage"]["completion_tokens"]
        assert {f"gen_ai.request.{name}": value for name, value in params.items()}.items() <= seen.items()
        e2e, ttft = seen["gen_ai.latency.e2e"], seen["gen_ai.latency.time_to_first_token"]
        assert 0 <= seen["gen_ai.latency.time_in_queue"] <= ttft <= e2e
        assert seen["gen_ai.latency.time_in_model_prefill"] <= ttft
        assert seen["gen_ai.latency.time_in_model_inference"] == pytest.approx(
            seen["gen_ai.latency.time_in_model_prefill"] + seen["gen_ai.latency.time_in_model_decode"])
        assert abs((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9 - e2e) < 0.01
        # --collect-detailed-traces all: each step's forward pass lies inside its submission-to-tokens time
        assert 0 < seen["gen_ai.latency.time_in_model_forward"] <= seen["gen_ai.latency.time_in_model_execute"]
        assert seen["gen_ai.latency.time_in_model_execute"] <= seen["gen_ai.latency.time_in_model_inference"] + 0.01
