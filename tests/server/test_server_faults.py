"""Faults: clients that leave in every phase free their KV blocks; a failing model step fails only its
requests; the server keeps serving afterwards."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest

from helpers.inprocess_server import InProcessServer
from helpers.waiting import wait_until
from llmctl.engine.core.sequence import SequenceStatus
from llmctl.engine.front.llm_engine import LLMEngine

FAULT_TOKEN = 4242  # a prompt starting with this token id makes the model step fail


@pytest.fixture(scope="module")
def engine(default_source):
    # Small steps: a 600-token prompt takes ten prefill steps, so a client can leave in the middle.
    return LLMEngine(model=str(default_source.path), max_model_len=1024, max_num_seqs=2, max_num_batched_tokens=64)


@pytest.fixture()
def server(engine):
    with InProcessServer(engine) as server:
        yield server
        assert server.wait_idle(), "requests or KV blocks were left behind"


def completion(prompt, max_tokens: int, stream: bool = False) -> dict:
    return {"model": "test-model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}


def wait_for(condition, timeout: float = 60) -> None:
    wait_until(condition, "the engine", timeout)


def sequences(engine, status: SequenceStatus) -> list:
    return [s for r in list(engine.output_processor.requests.values()) for s in r.seqs if s.status == status]


def test_clients_leaving_in_every_phase_free_their_blocks(server, engine):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        # Streaming: leave after a few tokens.
        with client.stream("POST", "/v1/completions", json=completion("Tell me a story", 500, True)) as response:
            lines = response.iter_lines()
            for _ in range(3):
                next(line for line in lines if line.startswith("data:"))
        assert server.wait_idle()
        # Prefilling: leave while a long prompt is still being computed chunk by chunk.
        with client.stream("POST", "/v1/completions", json=completion([1000] * 600, 50, True)):
            wait_for(lambda: any(s.in_prefill and s.num_computed_tokens > 0
                                 for s in sequences(engine, SequenceStatus.RUNNING)))
        assert server.wait_idle()
        # Queued: two long requests fill max_num_seqs; a third waits, and its client leaves (non-streaming).
        busy = [client.stream("POST", "/v1/completions", json=completion("Count", 500, True)) for _ in range(2)]
        for stream in busy:
            stream.__enter__()
        wait_for(lambda: len(sequences(engine, SequenceStatus.RUNNING)) == 2)
        with ThreadPoolExecutor(1) as pool:  # the client gives up after 3 s, while its request still waits
            queued = pool.submit(client.post, "/v1/completions", json=completion("Queued", 20), timeout=3.0)
            wait_for(lambda: len(sequences(engine, SequenceStatus.WAITING)) == 1)
            with pytest.raises(httpx.ReadTimeout):
                queued.result()
        wait_for(lambda: not sequences(engine, SequenceStatus.WAITING), timeout=10)  # the queued one was aborted
        for stream in busy:
            stream.__exit__(None, None, None)
    assert server.wait_idle()


def test_a_failing_model_step_fails_only_its_requests(server, engine):
    original = engine.executor.submit

    def submit(batch):  # requests here run one at a time: the running sequences are the batch's
        if any(seq.prompt_token_ids[0] == FAULT_TOKEN and len(seq.output_token_ids) >= 2
               for seq in engine.scheduler.running):
            raise RuntimeError("injected fault")
        return original(batch)

    engine.executor.submit = submit
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            response = client.post("/v1/completions", json=completion([FAULT_TOKEN, 5, 6], 10))
            assert response.status_code == 500
            error = response.json()["error"]
            assert error["type"] == "internal_server_error" and error["code"] == 500
            assert "injected fault" in error["message"]
            with client.stream("POST", "/v1/completions", json=completion([FAULT_TOKEN, 7], 10, True)) as stream:
                events = [json.loads(line[5:]) for line in stream.iter_lines()
                          if line.startswith("data:") and line != "data: [DONE]"]
            assert events[-1]["error"]["code"] == 500 and events[-1]["error"]["type"] == "internal_server_error"
            assert sum(1 for e in events if "choices" in e) == 2  # the tokens before the fault arrived
            # The engine lives on: a request that does not trigger the fault is served.
            ok = client.post("/v1/completions", json=completion("The capital of France is", 4))
            assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"
            assert client.get("/health").status_code == 200
    finally:
        engine.executor.submit = original


def test_limits_auth_cors_and_request_ids(engine, caplog):
    import logging
    import socket

    caplog.set_level(logging.INFO, logger="llmctl")
    settings = dict(api_key="sekret", metrics_auth=True, max_request_bytes=8192, body_timeout=1.0,
                    stats_interval=0.2)
    with InProcessServer(engine, **settings) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        key = {"Authorization": "Bearer sekret"}
        big = client.post("/v1/completions", headers=key, content=b"{" + b" " * 9000 + b"}")
        assert big.status_code == 413 and "--max-request-bytes" in big.json()["error"]["message"]
        many = client.post("/v1/completions", headers=key, json={"prompt": ["a"] * 1025, "max_tokens": 1})
        assert many.status_code == 400 and "at most 1024" in many.json()["error"]["message"]
        assert client.post("/v1/completions", headers=key, json={"prompt": "a", "n": 129}).status_code == 400
        # A client that never finishes its body is answered 408, not waited on forever.
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
            sock.settimeout(20)
            assert b" 408 " in sock.recv(4096).split(b"\r\n")[0] + b" "
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=key).status_code == 200
        assert client.get("/health").status_code == 200
        # CORS is off unless origins are configured: no allow-origin header for a browser preflight.
        preflight = client.options("/v1/completions", headers={"Origin": "http://evil.example",
                                                               "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers
        ok = client.post("/v1/completions", headers={**key, "X-Request-Id": "trace-123"},
                         json=completion("Hello", 8))
        assert ok.status_code == 200 and ok.headers["x-request-id"] == "trace-123"
        assert ok.json()["id"] == "cmpl-trace-123"
        refused = client.post("/v1/completions", json=completion("Hello", 2))
        assert refused.status_code == 401 and refused.headers["x-request-id"]

        def logged(test) -> bool:
            return any(test(r.getMessage()) for r in list(caplog.records))

        wait_until(lambda: logged(lambda line: line.startswith("Avg prompt throughput:") and "KV cache usage" in line),
                   "the periodic engine-stats line")
    assert logged(lambda line: '"POST /v1/completions" 200' in line and "request_id=trace-123" in line)


def test_cors_when_configured(engine):
    with InProcessServer(engine, allowed_origins=["http://app.example"]) as server:
        response = httpx.options(server.url + "/v1/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
        assert response.headers["access-control-allow-origin"] == "http://app.example"


def test_a_dead_engine_is_reported_as_such(default_source):
    """An error outside a model step stops the engine: streams end with a 500 event (as vLLM reports a dead
    engine), /health turns 503 and new requests are refused with 503."""
    engine = LLMEngine(model=str(default_source.path), max_model_len=256)
    original = engine.scheduler.schedule
    calls = {"n": 0}

    def schedule(lane=0):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("scheduler bug")
        return original(lane)

    engine.scheduler.schedule = schedule
    with InProcessServer(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=completion("Hello", 20, True)) as stream:
            events = [json.loads(line[5:]) for line in stream.iter_lines()
                      if line.startswith("data:") and line != "data: [DONE]"]
        error = events[-1]["error"]
        assert error["code"] == 500 and error["type"] == "internal_server_error" and "scheduler bug" in error["message"]
        assert client.get("/health").status_code == 503
        refused = client.post("/v1/completions", json=completion("Hello", 2))
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable"


def test_a_cuda_error_in_a_step_stops_the_engine(default_source):
    """CUDA errors are sticky: after one, every step would fail while /health said healthy. The engine
    stops instead (an injected error with CUDA's own wording, as a worker rank or torch reports it)."""
    engine = LLMEngine(model=str(default_source.path), max_model_len=256)
    original = engine.executor.submit

    def submit(batch):
        if any(len(seq.output_token_ids) >= 2 for seq in engine.scheduler.running):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return original(batch)

    engine.executor.submit = submit
    with InProcessServer(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        failed = client.post("/v1/completions", json=completion("Hello", 20))
        assert failed.status_code in (500, 503) and "the GPU failed in a model step" in failed.json()["error"]["message"]
        assert client.get("/health").status_code == 503
        refused = client.post("/v1/completions", json=completion("Hello", 2))
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "service_unavailable"


def test_clients_may_reuse_a_request_id(server):
    """X-Request-Id is the client's label: two requests in flight with the same one are both served."""
    from concurrent.futures import ThreadPoolExecutor

    def send(_):
        return httpx.post(server.url + "/v1/completions", headers={"X-Request-Id": "same"},
                          json=completion("Hello", 6), timeout=60)

    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(send, range(2)))
    assert [r.status_code for r in responses] == [200, 200]
    assert all(r.json()["id"] == "cmpl-same" for r in responses)
