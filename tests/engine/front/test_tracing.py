"""Tracing from the offline LLM (vLLM's LLM(otlp_traces_endpoint=...)) over OTLP/gRPC, the exporter's default
protocol, to a collector the test runs; and the settings that are refused at startup with what to do."""

from __future__ import annotations

import sys

import pytest

from helpers.models import save_random_model, small_config
from helpers.otlp_collector import GrpcCollector, attributes
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.engine.front.llm import LLM
from llmctl.engine.sampling_params import SamplingParams


def test_the_offline_llm_sends_a_span_per_generation_request_over_grpc(tmp_path, tokenizer, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    collector = GrpcCollector()
    try:
        folder = save_random_model(small_config("llama-gqa", tokenizer), tmp_path / "m", tokenizer)
        llm = LLM(str(folder), max_model_len=64, otlp_traces_endpoint=collector.endpoint,
                  collect_detailed_traces="worker")
        outputs = llm.generate(["a b c", "hello world"], SamplingParams(max_tokens=3, temperature=0))
        llm.shutdown()  # the batched spans are sent
        spans = collector.wait_for(2, timeout=10)
    finally:
        collector.stop()
    by_id = {attributes(span)["gen_ai.request.id"]: attributes(span) for span in spans}
    assert sorted(by_id) == sorted(output.request_id for output in outputs)
    for output in outputs:
        seen = by_id[output.request_id]
        assert seen["gen_ai.usage.prompt_tokens"] == len(output.prompt_token_ids)
        assert seen["gen_ai.usage.completion_tokens"] == len(output.outputs[0].token_ids) == 3
        assert seen["gen_ai.request.max_tokens"] == 3 and seen["gen_ai.request.temperature"] == 0
        assert seen["gen_ai.latency.time_in_model_execute"] > 0  # "worker" collected
        assert "gen_ai.latency.time_in_model_forward" not in seen  # "model" was not asked for


@pytest.mark.parametrize(("fields", "env", "says"), [
    ({"collect_detailed_traces": "all"}, {}, "give --otlp-traces-endpoint too"),
    ({"otlp_traces_endpoint": "http://127.0.0.1:4317", "collect_detailed_traces": "model,everything"}, {},
     "model, worker, all"),
    ({"otlp_traces_endpoint": "http://127.0.0.1:4317", "collect_detailed_traces": "model",
      "async_scheduling": True}, {}, "use worker instead"),
    ({"otlp_traces_endpoint": "http://127.0.0.1:4317"}, {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
     "grpc (the default) or http/protobuf"),
])
def test_tracing_settings_that_cannot_work_are_refused_at_startup(fields, env, says, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(EngineConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(**fields).validate()


def test_a_missing_exporter_says_which_extra_to_install(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(EngineConfigError, match=r"pip install 'llmctl\[otel\]'"):
        EngineConfig(otlp_traces_endpoint="http://127.0.0.1:4317").validate()
