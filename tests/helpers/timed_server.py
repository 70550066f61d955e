"""A small real OpenAI-style HTTP server with known timing, for checking bench's measurements.

Every streamed request waits `first_delay` before its first token and `gap` between the
others, and sends exactly max_tokens one-word chunks, then a usage chunk and [DONE].
Requests can be made to fail: `fail` maps a request's arrival number (0-based) to
"error" (HTTP 500 with an OpenAI error body) or "drop" (the connection closes mid-stream).
It also exposes vLLM-named Prometheus metrics that move with the requests it serves.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from helpers.server_helpers import ThreadedUvicorn


@dataclass
class Timing:
    first_delay: float = 0.2
    gap: float = 0.05
    fail: dict[int, str] = field(default_factory=dict)


class TimedServer:
    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.arrivals = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.served_tokens = 0
        self.bodies: list[dict] = []  # every request body, as received
        app = Starlette(routes=[
            Route("/v1/models", self.models),
            Route("/v1/completions", self.complete, methods=["POST"]),
            Route("/v1/chat/completions", self.complete, methods=["POST"]),
            Route("/metrics", self.metrics),
        ])
        self.http = ThreadedUvicorn(app)

    @property
    def url(self) -> str:
        return self.http.url

    def __enter__(self) -> TimedServer:
        self.http.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.stop()

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "timed-model", "object": "model",
                                                         "root": "timed-model"}]})

    async def metrics(self, request: Request) -> Response:
        lines = ["# TYPE vllm:kv_cache_usage_perc gauge",
                 f'vllm:kv_cache_usage_perc{{model_name="timed-model"}} {self.in_flight / 10}',
                 "# TYPE vllm:num_preemptions counter",
                 f'vllm:num_preemptions_total{{model_name="timed-model"}} {self.arrivals // 2}',
                 "# TYPE vllm:prefix_cache_queries counter",
                 f'vllm:prefix_cache_queries_total{{model_name="timed-model"}} {self.arrivals * 100}',
                 "# TYPE vllm:prefix_cache_hits counter",
                 f'vllm:prefix_cache_hits_total{{model_name="timed-model"}} {self.arrivals * 25}']
        return PlainTextResponse("\n".join(lines) + "\n")

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        number = self.arrivals
        self.arrivals += 1
        failure = self.timing.fail.get(number)
        if failure == "error":
            return JSONResponse({"error": {"message": "the model is on fire", "type": "InternalServerError",
                                           "code": 500}}, status_code=500)
        chat = "messages" in body
        return StreamingResponse(self.stream(body["max_tokens"], chat, drop=failure == "drop"),
                                 media_type="text/event-stream")

    async def stream(self, tokens: int, chat: bool, drop: bool):
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.timing.first_delay)
            for index in range(tokens):
                if index:
                    await asyncio.sleep(self.timing.gap)
                if drop and index == tokens // 2:
                    raise ConnectionResetError("dropped on purpose")
                choice = {"index": 0, "delta": {"content": " word"}} if chat else {"index": 0, "text": " word"}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                self.served_tokens += 1
            usage = {"completion_tokens": tokens}  # no prompt_tokens: bench keeps its own prompt counts
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.in_flight -= 1
