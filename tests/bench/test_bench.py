"""llmctl bench: metric definitions, datasets, load shapes, failures, and a real `llmctl serve` run."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from helpers.cli_process import run_cli
from helpers.server_helpers import start_server
from helpers.timed_server import TimedServer, Timing
from llmctl.bench.client import RequestOutcome
from llmctl.bench.datasets import DatasetOptions, sample_requests
from llmctl.bench.load import LoadPoint, arrival_offsets
from llmctl.bench.metrics import calculate_metrics, parse_goodput, peak_concurrency
from llmctl.bench.server_metrics import parse_metrics
from llmctl.bench.tokens import load_local_tokenizer
from llmctl.checkpoint.source import DEFAULT_MODEL_ID
from llmctl.errors import LlmctlError

pytestmark = pytest.mark.subprocess

FIRST, GAP, TOKENS = 0.2, 0.05, 6
CLOCK_GRAIN_S = 0.005  # a sleep of d seconds is never measured shorter than d, up to the clock's granularity


@pytest.fixture(scope="module")
def smol():
    tokenizer = load_local_tokenizer(None)
    return tokenizer, tokenizer.words()


def bench(server_url: str, *args: str, tmp_path) -> dict:
    out = tmp_path / "result.json"
    result = run_cli("bench", "serve", "--base-url", server_url, "--tokenizer", DEFAULT_MODEL_ID,
                     "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", str(TOKENS), "--result-filename", str(out),
                     *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(out.read_text())


# --- metrics against a server with known timing ----------------------------------------------------------


def test_a_request_is_timed_at_its_chunks_on_an_injected_clock():
    """A real stream from the timed server, timed by a scripted clock: one reading when the request is sent
    and one per data chunk. TTFT, ITL and latency are exact, and the usage chunk (read 10 s later)
    does not end the latency."""
    import asyncio

    import httpx2

    from llmctl.bench.client import RequestSettings, send_request
    from llmctl.bench.datasets import SampleRequest

    readings = [100.0] + [100.0 + FIRST + k * GAP for k in range(TOKENS)] + [110.0]
    clock = iter(readings).__next__
    with TimedServer(Timing(0.0, 0.0)) as server:
        async def one():
            async with httpx2.AsyncClient() as client:
                return await send_request(client, SampleRequest("hello", 1, TOKENS),
                                          RequestSettings(server.url, "timed-model"), clock=clock)
        outcome = asyncio.run(one())
    assert outcome.success and outcome.output_tokens == TOKENS
    assert outcome.start_time == 100.0 and outcome.ttft == pytest.approx(FIRST)
    assert outcome.itl == pytest.approx([GAP] * (TOKENS - 1))
    assert outcome.latency == pytest.approx(FIRST + (TOKENS - 1) * GAP)
    with pytest.raises(StopIteration):
        clock()  # every reading was taken: one per chunk, none more


@pytest.mark.parametrize("rate, concurrency", [("inf", "none"), ("8", "none"), ("inf", "2")])
def test_measured_latencies_respect_the_servers_timing(tmp_path, rate, concurrency):
    """Against a server that sleeps known times: no measurement can be shorter than a sleep, each request's
    latency is its TTFT plus its gaps, and the concurrency bench reports lies between the server's own
    count and the limit. Nothing here depends on how fast this machine is."""
    with TimedServer(Timing(FIRST, GAP)) as server:
        data = bench(server.url, "--num-prompts", "6", "--request-rate", rate, "--max-concurrency", concurrency,
                     tmp_path=tmp_path)
        server_peak = server.peak_in_flight
    e2el = FIRST + (TOKENS - 1) * GAP
    assert data["completed"] == 6 and data["failed"] == 0
    assert data["output_lens"] == [TOKENS] * 6  # from the server's usage
    assert all(len(gaps) == TOKENS - 1 for gaps in data["itls"])
    assert min(data["ttfts"]) >= FIRST - CLOCK_GRAIN_S
    assert min(data["e2els"]) >= e2el - CLOCK_GRAIN_S
    for ttft, gaps, latency in zip(data["ttfts"], data["itls"], data["e2els"]):
        assert latency == pytest.approx(ttft + sum(gaps))
    assert data["mean_ttft_ms"] == pytest.approx(1000 * np.mean(data["ttfts"]))
    assert data["mean_e2el_ms"] == pytest.approx(1000 * np.mean(data["e2els"]))
    # the wall time is at least what the load shape needs: all at once, paced arrivals, or two at a time
    shortest = {("inf", "none"): e2el, ("8", "none"): 5 / 8 + e2el, ("inf", "2"): 3 * e2el}[(rate, concurrency)]
    assert data["duration"] >= shortest - CLOCK_GRAIN_S
    assert data["request_throughput"] == pytest.approx(6 / data["duration"])
    assert data["output_throughput"] == pytest.approx(6 * TOKENS / data["duration"])
    # a request's span as bench sees it contains the server's span of it, so bench never counts fewer overlaps
    limit = 2 if concurrency == "2" else 6
    assert server_peak <= data["max_concurrent_requests"] <= limit, (server_peak, data["max_concurrent_requests"])


def test_chat_endpoint_and_server_metrics(tmp_path):
    with TimedServer(Timing(FIRST, GAP)) as server:
        # 40 tokens: each request streams ~2.2 s, long enough for the once-a-second KV-usage samples
        data = bench(server.url, "--num-prompts", "4", "--endpoint", "chat", "--max-concurrency", "4",
                     "--random-output-len", "40", tmp_path=tmp_path)
    assert data["completed"] == 4 and min(data["ttfts"]) >= FIRST - CLOCK_GRAIN_S, data["ttfts"]
    stats = data["server_metrics"]  # the timed server's vLLM-named counters: 4 arrivals
    assert stats["preemptions"] == 2 and stats["prefix_cache_queries"] == 400 and stats["prefix_cache_hits"] == 100
    assert stats["prefix_cache_hit_rate"] == 0.25
    assert 0 < stats["kv_cache_usage_peak"] <= 0.4


def test_errors_and_dropped_connections_are_failures_with_reasons(tmp_path):
    with TimedServer(Timing(0.05, 0.01, fail={1: "error", 3: "drop"})) as server:
        data = bench(server.url, "--num-prompts", "6", "--max-concurrency", "1", tmp_path=tmp_path)
    assert data["completed"] == 4 and data["failed"] == 2
    errors = [e for e in data["errors"] if e]
    assert any("HTTP 500: the model is on fire" in e for e in errors)
    assert any("closed before the stream finished" in e or "RemoteProtocolError" in e for e in errors)
    assert sorted(data["output_lens"]) == [0, 0] + [TOKENS] * 4


def test_sweep_writes_a_curve_and_charts(tmp_path):
    with TimedServer(Timing(0.05, 0.01)) as server:
        data = bench(server.url, "--num-prompts", "4", "--max-concurrency", "1,4", "--plot", str(tmp_path / "png"),
                     tmp_path=tmp_path)
    assert [p["max_concurrency"] for p in data["sweep"]] == [1, 4]
    one_at_a_time = 4 * (0.05 + (TOKENS - 1) * 0.01)  # four requests in a row, each at least its sleeps
    assert data["sweep"][0]["duration"] >= one_at_a_time - CLOCK_GRAIN_S
    assert data["sweep"][0]["max_concurrent_requests"] == 1
    for name in ("latency_vs_throughput.png", "ttft_distribution.png", "itl_distribution.png"):
        assert (tmp_path / "png" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_goodput_counts_requests_within_every_slo(tmp_path):
    with TimedServer(Timing(FIRST, GAP)) as server:
        data = bench(server.url, "--num-prompts", "4", "--goodput", "ttft:5000", "--goodput", "tpot:1000",
                     tmp_path=tmp_path)
        strict = bench(server.url, "--num-prompts", "4", "--goodput", "ttft:1", tmp_path=tmp_path)
    assert data["request_goodput"] == pytest.approx(data["request_throughput"])
    assert strict["request_goodput"] == 0


# --- metric arithmetic ------------------------------------------------------------------------------------


def outcome(start: float, ttft: float, gaps: list[float], tokens: int | None = None) -> RequestOutcome:
    return RequestOutcome(prompt_len=10, expected_output_len=len(gaps) + 1, success=True, start_time=start,
                          ttft=ttft, latency=ttft + sum(gaps), itl=gaps, generated_text="x" * (len(gaps) + 1),
                          output_tokens=tokens if tokens is not None else len(gaps) + 1)


def test_metric_definitions_follow_vllm():
    outcomes = [outcome(0.0, 0.1, [0.02, 0.04]), outcome(0.05, 0.3, [0.1] * 4), outcome(0.1, 0.2, []),
                RequestOutcome(10, 5, success=False, error="boom")]
    m = calculate_metrics(outcomes, duration=2.0, slos={"ttft": 250, "tpot": 50})
    assert (m.completed, m.failed, m.total_input_tokens, m.total_output_tokens) == (3, 1, 30, 9)
    tpots = [0.06 / 2, 0.4 / 4]  # (e2el − ttft) / (tokens − 1); a one-token request has no TPOT
    assert m.latencies["tpot"].mean == pytest.approx(np.mean(tpots) * 1000)
    itls = [0.02, 0.04] + [0.1] * 4
    assert m.latencies["itl"].percentiles[99.0] == pytest.approx(np.percentile(itls, 99) * 1000)
    assert m.latencies["ttft"].median == pytest.approx(200)
    # good: request 1 (ttft 100, tpot 30) and request 3 (ttft 200, tpot counted as 0); request 2 misses TTFT
    assert m.request_goodput == pytest.approx(2 / 2.0)
    assert m.request_throughput == 1.5 and m.output_throughput == 4.5 and m.total_token_throughput == 19.5
    assert m.output_lens == [3, 5, 1, 0] and m.errors == ["", "", "", "boom"]


def test_output_tokens_fall_back_to_the_tokenizer_without_usage():
    no_usage = outcome(0.0, 0.1, [0.05, 0.05], tokens=None)
    no_usage.output_tokens = None
    m = calculate_metrics([no_usage], 1.0, {}, count_tokens=lambda text: 7)
    assert m.output_lens == [7] and m.request_goodput is None


def test_peak_concurrency_uses_half_open_intervals():
    # back to back requests never overlap; a third one inside the first does
    outcomes = [outcome(0.0, 0.5, [0.5]), outcome(1.0, 0.5, [0.5]), outcome(0.2, 0.1, [0.1])]
    assert peak_concurrency(outcomes) == 2


def test_goodput_flag_parsing():
    assert parse_goodput(["ttft:200 tpot:50", "e2el:1000"]) == {"ttft": 200, "tpot": 50, "e2el": 1000}
    for bad in ("itl:5", "ttft:fast", "ttft:-1"):
        with pytest.raises(LlmctlError):
            parse_goodput([bad])


def test_arrivals_poisson_gamma_and_inf():
    assert arrival_offsets(5, LoadPoint(math.inf), seed=0) == [0.0] * 5
    poisson = arrival_offsets(200, LoadPoint(4.0, 1.0), seed=1)
    assert poisson[-1] == pytest.approx(200 / 4)  # rescaled so the last leaves at num_prompts / rate
    assert poisson == sorted(poisson) and poisson == arrival_offsets(200, LoadPoint(4.0, 1.0), seed=1)
    gaps = np.diff(poisson)
    bursty = np.diff(arrival_offsets(200, LoadPoint(4.0, 0.25), seed=1))
    steady = np.diff(arrival_offsets(200, LoadPoint(4.0, 16.0), seed=1))
    assert np.std(bursty) > np.std(gaps) > np.std(steady)  # the coefficient of variation is 1/sqrt(burstiness)


def test_prometheus_text_is_read_without_prefixes():
    text = ('# TYPE llmctl:num_preemptions counter\nllmctl:num_preemptions_total{model_name="a"} 3.0\n'
            '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="a",engine="0"} 0.5\n'
            'vllm:kv_cache_usage_perc{model_name="a",engine="1"} 0.25\n')
    assert parse_metrics(text) == {"num_preemptions_total": 3.0, "kv_cache_usage_perc": 0.75}


# --- datasets ---------------------------------------------------------------------------------------------


def test_random_prompts_tokenize_to_the_requested_lengths(smol):
    tokenizer, words = smol
    options = DatasetOptions(num_prompts=20, random_input_len=64, random_output_len=16, random_range_ratio=0.5,
                             seed=3)
    requests = sample_requests(options, tokenizer, words)
    for request in requests:
        assert len(tokenizer.encode(request.prompt)) == request.prompt_len
        assert 32 <= request.prompt_len <= 96 and 8 <= request.expected_output_len <= 24
    assert len({r.prompt_len for r in requests}) > 5  # the range ratio spreads them
    assert requests == sample_requests(options, tokenizer, words)  # seeded: the same workload
    other = sample_requests(DatasetOptions(**{**options.__dict__, "seed": 4}), tokenizer, words)
    assert [r.prompt for r in other] != [r.prompt for r in requests]


def test_sharegpt_file_is_parsed_filtered_and_sampled(smol, tmp_path):
    tokenizer, words = smol
    rng = random.Random(0)
    records = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(rng.choice(words).strip() for _ in range(10 + i))},
        {"from": "gpt", "value": " ".join(rng.choice(words).strip() for _ in range(20 + i))}]} for i in range(12)]
    records.append({"id": "short", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})
    records.append({"id": "one-turn", "conversations": [{"from": "human", "value": "only a question here"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    options = DatasetOptions(name="sharegpt", path=path, num_prompts=8, seed=1)
    requests = sample_requests(options, tokenizer, words)
    assert len(requests) == 8 and requests == sample_requests(options, tokenizer, words)
    replies = {r["conversations"][0]["value"]: r["conversations"][1]["value"] for r in records[:12]}
    for request in requests:
        assert request.prompt in replies  # the tiny and the one-turn conversations are filtered out
        assert request.prompt_len == len(tokenizer.encode(request.prompt))
        assert request.expected_output_len == len(tokenizer.encode(replies[request.prompt]))
    fixed = sample_requests(DatasetOptions(name="sharegpt", path=path, num_prompts=3, sharegpt_output_len=5),
                            tokenizer, words)
    assert [r.expected_output_len for r in fixed] == [5, 5, 5]


def test_shared_prefix_groups_share_a_system_prompt(smol):
    tokenizer, words = smol
    options = DatasetOptions(name="shared-prefix", num_prompts=6, shared_prefix_groups=2, shared_prefix_len=40,
                             shared_prefix_question_len=8, shared_prefix_output_len=4)
    requests = sample_requests(options, tokenizer, words)
    assert len({r.system for r in requests}) == 2 and len({r.prompt for r in requests}) == 6
    assert all(len(tokenizer.encode(r.system)) == 40 and len(tokenizer.encode(r.prompt)) == 8 for r in requests)
    assert all(r.prompt_len == len(tokenizer.encode(r.full_prompt)) for r in requests)


def test_custom_jsonl_and_bad_files(smol, tmp_path):
    tokenizer, words = smol
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Tell me about Paris.", "output_tokens": 12}\n\n{"prompt": "And Rome?"}\n')
    requests = sample_requests(DatasetOptions(name="custom", path=path, custom_output_len=7), tokenizer, words)
    assert sorted(r.expected_output_len for r in requests) == [7, 12]
    path.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(LlmctlError, match="prompts.jsonl:1 needs a \"prompt\" string"):
        sample_requests(DatasetOptions(name="custom", path=path), tokenizer, words)
    with pytest.raises(LlmctlError, match="needs --dataset-path"):
        sample_requests(DatasetOptions(name="sharegpt"), tokenizer, words)


# --- the command line -------------------------------------------------------------------------------------


def test_unreachable_server_is_one_clear_line():
    result = run_cli("bench", "serve", "--base-url", "http://127.0.0.1:9", "--ready-check-timeout-sec", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "is unreachable" in result.stderr and "llmctl serve" in result.stderr


@pytest.mark.parametrize("flag, value, message", [("--request-rate", "fast", "comma-separated list"),
                                                  ("--max-concurrency", "0", "comma-separated list"),
                                                  ("--goodput", "itl:5", "ttft, tpot or e2el"),
                                                  ("--dataset-name", "sonnet", "unknown --dataset-name")])
def test_bad_flags_are_one_clear_line(flag, value, message):
    # also the path where the served model's tokenizer cannot be loaded (no /tokenize here either)
    with TimedServer(Timing(0.01, 0.01)) as server:
        result = run_cli("bench", "serve", "--base-url", server.url, "--num-prompts", "2", flag, value)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_against_llmctl_serve_with_the_default_model(tmp_path, smol):
    # served under a name no tokenizer can be loaded for: prompt lengths are counted by the server's /tokenize
    server = start_server("--max-num-seqs", "8", "--served-model-name", "my-smol")
    try:
        out = tmp_path / "smol.json"
        result = run_cli("bench", "serve", "--base-url", server.url, "--num-prompts", "6", "--random-input-len",
                         "24", "--random-output-len", "8", "--random-range-ratio", "0.5", "--ignore-eos",
                         "--request-rate", "20", "--num-warmups", "1", "--result-filename", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "counting tokens with the server's /tokenize" in " ".join(result.stdout.split())
        data = json.loads(out.read_text())
        assert data["completed"] == 6 and data["failed"] == 0 and data["model_id"] == "my-smol"
        # usage-based counts equal the requested lengths because of ignore_eos (the seeded workload, rebuilt here)
        tokenizer, words = smol
        requests = sample_requests(DatasetOptions(num_prompts=6, random_input_len=24, random_output_len=8,
                                                  random_range_ratio=0.5), tokenizer, words)
        assert data["output_lens"] == [r.expected_output_len for r in requests]
        assert data["input_lens"] == [r.prompt_len for r in requests]
        assert data["server_metrics"]["prefix_cache_queries"] >= sum(data["input_lens"])
        assert "Output token throughput" in result.stdout and "KV-cache usage" in result.stdout
    finally:
        server.stop()


def test_unloadable_tokenizer_without_tokenize_endpoint_warns(tmp_path):
    out = tmp_path / "result.json"
    with TimedServer(Timing(0.01, 0.01)) as server:
        result = run_cli("bench", "serve", "--base-url", server.url, "--num-prompts", "2", "--random-input-len", "8",
                         "--random-output-len", "2", "--result-filename", str(out))
    assert result.returncode == 0, result.stderr
    assert "counted with the default model's tokenizer" in " ".join(result.stdout.split())
    assert json.loads(out.read_text())["input_lens"] == [8, 8]


def test_offline_with_transformers_comparison():
    result = run_cli("bench", "offline", "--num-prompts", "4", "--random-input-len", "16", "--random-output-len",
                     "8", "--compare", "transformers", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["llmctl"]["requests"] == 4 and data["llmctl"]["output_tokens"] == 32
    assert data["llmctl"]["input_tokens"] == 64 and data["transformers"]["output_tokens"] == 32
    assert data["transformers_on"] == "float32 on cpu"  # the engine's device and dtype (bf16 on cuda on a GPU)
    assert data["ratio_output_tokens_per_s"] == pytest.approx(
        data["llmctl"]["output_tokens_per_s"] / data["transformers"]["output_tokens_per_s"])
    assert data["ttft_ms"]["mean"] > 0 and data["tpot_ms"]["mean"] > 0
    assert data["startup_s"] > 0
    [rank] = data["ranks"]  # one process: its weights (SmolLM2-135M's Q4_1 codes, not 0.54 GB of float32) and KV
    assert 80e6 < rank["weights_bytes"] < 200e6 and rank["kv_cache_bytes"] > 0


def test_sse_lines_break_only_where_server_sent_events_do():
    """vLLM leaves U+2028, U+2029 and U+0085 raw inside JSON strings; they must not split an event."""
    import asyncio

    from llmctl.bench.client import sse_lines

    text = 'data: {"text": "a\u2028b\x85c\u2029d"}\r\n\r\ndata: [DONE]\n\n'

    async def chunks():
        for i in range(0, len(text), 7):  # arbitrary chunk boundaries, one inside a CRLF
            yield text[i:i + 7]

    async def collect():
        return [line async for line in sse_lines(chunks())]

    lines = [line for line in asyncio.run(collect()) if line]
    assert lines == ['data: {"text": "a\u2028b\x85c\u2029d"}', "data: [DONE]"]
    assert json.loads(lines[0][5:])["text"] == "a\u2028b\x85c\u2029d"


def test_served_events_escape_characters_some_readers_take_for_line_breaks():
    from llmctl.server.sse import sse

    event = sse({"text": "a\u2028b\x85c\x1cd"})
    assert event.splitlines() == [event[:-2], ""]  # str.splitlines sees one line, then the blank separator
    assert json.loads(event[len("data: "):])["text"] == "a\u2028b\x85c\x1cd"


def test_vllm_flags_choose_the_api_the_metrics_and_the_sampling(tmp_path):
    """--host/--port, --backend openai-chat with a URL-path --endpoint, --goodput with two values after one flag,
    --percentile-metrics and --top-k as vLLM spells them, against a real HTTP server."""
    with TimedServer(Timing(0.05, 0.01)) as server:
        port = server.url.rsplit(":", 1)[1]
        out = tmp_path / "result.json"
        result = run_cli("bench", "serve", "--host", "127.0.0.1", "--port", port, "--backend", "openai-chat",
                         "--endpoint", "/v1/chat/completions", "--tokenizer", DEFAULT_MODEL_ID, "--dataset-name",
                         "random", "--random-input-len", "8", "--random-output-len", str(TOKENS), "--num-prompts", "2",
                         "--goodput", "ttft:60000", "e2el:60000", "--percentile-metrics", "ttft,e2el",
                         "--top-k", "5", "--result-filename", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        bodies = list(server.bodies)
    data = json.loads(out.read_text())
    assert data["completed"] == 2 and data["request_goodput"] == pytest.approx(2 / data["duration"])
    assert "p99_ttft_ms" in data and "mean_e2el_ms" in data and "mean_itl_ms" not in data and "mean_tpot_ms" not in data
    assert all("messages" in body and body["top_k"] == 5 for body in bodies)  # the chat API, top_k sent
    bad = run_cli("bench", "serve", "--percentile-metrics", "ttft,latency")
    assert bad.returncode == 2 and "use a comma-separated subset of ttft,tpot,itl,e2el" in bad.stderr


def test_offline_with_a_json_schema_and_a_bad_one():
    """--json-schema: every request constrained (a schema whose string outlasts the run: 8 tokens each);
    a schema xgrammar cannot compile, or text that is not JSON, is one clear error."""
    schema = '{"type": "object", "properties": {"s": {"type": "string", "minLength": 500}}, "required": ["s"]}'
    result = run_cli("bench", "offline", "--num-prompts", "2", "--random-input-len", "16", "--random-output-len",
                     "8", "--json-schema", schema, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["llmctl"]["output_tokens"] == 16
    for bad, words in (('{"type": "objec"}', "Unsupported type"), ("{not json", "neither a file nor valid JSON")):
        result = run_cli("bench", "offline", "--num-prompts", "2", "--random-input-len", "16",
                         "--random-output-len", "8", "--json-schema", bad)
        assert result.returncode != 0 and words in result.stderr and "Traceback" not in result.stderr, result.stderr
