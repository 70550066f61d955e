"""What tools written for a vLLM server read, read from llmctl: /v1/models and /version as vLLM answers them
(several --served-model-name), and `--metrics-prefix vllm`: /metrics under vLLM's names, so vLLM's Grafana
dashboard and autoscalers read a llmctl server unchanged. The series below are every one that dashboard queries
(vllm-project/vllm examples/online_serving/prometheus_grafana/grafana.json at commit 004f771f), each with
the label its panels filter on; their values are checked against what the requests really did."""

from __future__ import annotations

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers.cli_process import run_cli
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess

MODEL, ALIAS = "smollm2", "small"
# vLLM's ModelCard and ModelPermission fields (vllm/entrypoints/serve/engine/protocol.py, vllm 0.32)
CARD_FIELDS = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
PERMISSION_FIELDS = {"id", "object", "created", "allow_create_engine", "allow_sampling", "allow_logprobs",
                     "allow_search_indices", "allow_view", "allow_fine_tuning", "organization", "group", "is_blocking"}
DASHBOARD_SERIES = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
]


def scrape(server) -> dict[str, list]:
    status, text = server.get("/metrics")
    assert status == 200
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def total(samples: dict[str, list], name: str) -> float:
    return sum(sample.value for sample in samples[name])


@pytest.fixture(scope="module")
def vllm_named_server(default_source):
    server = start_server("--max-model-len", "512", "--metrics-prefix", "vllm", "--served-model-name", MODEL, ALIAS)
    yield server
    server.stop()


def test_every_series_of_vllms_dashboard_is_there_with_the_requests_numbers(vllm_named_server):
    client = openai.OpenAI(base_url=vllm_named_server.url + "/v1", api_key="none")
    usages = [client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=5, temperature=0,
                                        extra_body={"ignore_eos": True}).usage,
              client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, n=2, temperature=0.8,
                                        extra_body={"ignore_eos": True}).usage]
    samples = scrape(vllm_named_server)
    for series in DASHBOARD_SERIES:
        assert series in samples, series
        assert all(sample.labels.get("model_name") == MODEL for sample in samples[series]), series
    assert not [name for name in samples if name.startswith("llmctl:")]
    assert total(samples, "vllm:request_prompt_tokens_sum") == sum(u.prompt_tokens for u in usages)
    assert total(samples, "vllm:request_generation_tokens_sum") == sum(u.completion_tokens for u in usages) == 11
    assert total(samples, "vllm:request_max_num_generation_tokens_sum") == 5 + 3
    for phase in ("queue", "prefill", "decode", "inference"):
        assert total(samples, f"vllm:request_{phase}_time_seconds_count") == 2, phase
    assert total(samples, "vllm:request_success_total") == 3  # one per choice
    assert {s.labels["finished_reason"] for s in samples["vllm:request_success_total"]} == {"length"}
    assert total(samples, "vllm:time_per_output_token_seconds_count") == \
        total(samples, "vllm:inter_token_latency_seconds_count") > 0
    assert total(samples, "vllm:gpu_cache_usage_perc") == total(samples, "vllm:kv_cache_usage_perc")


def test_models_and_version_as_vllm_answers_them(vllm_named_server):
    import json

    from llmctl import __version__
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID

    status, body = vllm_named_server.get("/v1/models")
    listing = json.loads(body)
    assert status == 200 and listing["object"] == "list"
    assert [card["id"] for card in listing["data"]] == [MODEL, ALIAS]
    for card in listing["data"]:
        assert set(card) == CARD_FIELDS and card["object"] == "model" and card["parent"] is None
        assert card["root"] == DEFAULT_MODEL_ID and card["max_model_len"] == 512  # the model as given, as vLLM
        (permission,) = card["permission"]
        assert set(permission) == PERMISSION_FIELDS and permission["object"] == "model_permission"
        assert permission["id"].startswith("modelperm-") and permission["allow_sampling"] is True
    client = openai.OpenAI(base_url=vllm_named_server.url + "/v1", api_key="none")
    answers = [client.completions.create(model=name, prompt="Hi", max_tokens=2, temperature=0) for name in (MODEL, ALIAS)]
    assert [a.model for a in answers] == [MODEL, ALIAS] and answers[0].choices[0].text == answers[1].choices[0].text
    assert json.loads(vllm_named_server.get("/version")[1]) == {"version": __version__}


def test_an_unknown_metrics_prefix_is_refused():
    done = run_cli("serve", "--metrics-prefix", "prom", timeout=120)
    assert done.returncode == 2 and "--metrics-prefix 'prom': choose llmctl or vllm" in done.stderr, done.stderr
