"""What an operator sees: a request id on every request, an access log line per request, and a
periodic engine stats line (vLLM's "Avg prompt throughput … Running … KV cache usage" line)."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmctl.engine.front.stats import EngineStats

logger = logging.getLogger("llmctl.server")
REQUEST_ID_HEADER = "x-request-id"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_of(scope: Mapping[str, Any]) -> str:
    return str(scope.get("state", {}).get("request_id", "-"))


class RequestLog:
    """ASGI middleware: takes the client's X-Request-Id (when it is a plain token) or makes one, returns
    it as a response header, and logs one line per request with its status and duration when asked."""

    def __init__(self, app: ASGIApp, enabled: bool) -> None:
        self.app, self.enabled = app, enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1")
        request_id = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started, status = time.perf_counter(), [0]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID_HEADER.encode(), request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.enabled:
                client = scope.get("client") or ("-", 0)
                logger.info('%s:%s "%s %s" %s %.3f s request_id=%s', client[0], client[1], scope["method"],
                            scope["path"], status[0] or "disconnected", time.perf_counter() - started, request_id)


@dataclass
class _Totals:
    stats: EngineStats
    at: float


class StatsLogger:
    """Every `interval` seconds while the engine has work (or just had), one INFO line of throughput,
    queue and KV-cache state, computed from the engine's counters over the interval."""

    def __init__(self, read_stats: Callable[[], EngineStats | None], interval: float) -> None:
        self.read_stats, self.interval = read_stats, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmctl-stats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last: _Totals | None = None
        while not self._stop.wait(self.interval):
            stats = self.read_stats()
            if stats is None:
                continue
            now = _Totals(stats, time.perf_counter())
            if last is not None:
                line = stats_line(last, now)
                if line:
                    logger.info(line)
            last = now


def stats_line(before: _Totals, now: _Totals) -> str | None:
    """None when nothing ran and nothing waits (an idle server stays quiet, as vLLM's does)."""
    old, new = before.stats, now.stats
    prompt = new.prompt_tokens - old.prompt_tokens
    generated = new.generation_tokens - old.generation_tokens
    if not (prompt or generated or new.num_running or new.num_waiting):
        return None
    seconds = max(now.at - before.at, 1e-9)
    queries = new.prefix_cache_queries - old.prefix_cache_queries
    hit_rate = 100.0 * (new.prefix_cache_hits - old.prefix_cache_hits) / queries if queries else 0.0
    return (f"Avg prompt throughput: {prompt / seconds:.1f} tokens/s, Avg generation throughput: "
            f"{generated / seconds:.1f} tokens/s, Running: {new.num_running} reqs, Waiting: {new.num_waiting} reqs, "
            f"KV cache usage: {100.0 * new.kv_cache_usage:.1f}%, Prefix cache hit rate: {hit_rate:.1f}%")
