"""One routed model's `llmctl serve` process on 127.0.0.1: started on demand (its /health polled until it answers
200, or it exits, or the load times out), stopped with SIGTERM (its in-flight requests finish first)."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from llmctl.server.router.catalog import RoutedModel

logger = logging.getLogger("llmctl.server")
STOP_SECONDS = 40  # its graceful shutdown (30 s) and a margin


@dataclass
class ModelProcess:
    model: RoutedModel
    shared_flags: tuple[str, ...]
    state: str = "unloaded"  # unloaded | loading | loaded | failed
    error: str | None = None  # why the last load failed
    last_used: float = 0.0
    in_flight: int = 0  # requests being answered: it is not stopped under them
    port: int = 0
    loaded: asyncio.Event = field(default_factory=asyncio.Event)  # set when a load ends, loaded or failed
    _process: subprocess.Popen[bytes] | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        model = [self.model.path] if self.model.path else []
        return [sys.executable, "-m", "llmctl", "serve", *model, "--served-model-name", self.model.name,
                *self.shared_flags, *self.model.flags, "--host", "127.0.0.1", "--port", str(self.port)]

    def start_loading(self, timeout: float) -> None:
        """It is "loading" from now; a task starts it and sets `loaded` when that ends, one way or the other."""
        self.state, self.error, self.port = "loading", None, _free_port()
        self.loaded.clear()
        self._task = asyncio.create_task(self._load(timeout))  # held: a task nobody references may be collected

    async def _load(self, timeout: float) -> None:
        logger.info("loading %s (%s)", self.model.name, self.model.path or "the default model")
        started = time.perf_counter()
        self._process = subprocess.Popen(self.command())  # its logs go where the router's go
        try:
            await self._wait_healthy(timeout)
            self.state = "loaded"
            logger.info("%s loaded in %.1f s", self.model.name, time.perf_counter() - started)
        except Exception as exc:
            self.state, self.error = "failed", str(exc)
            logger.error("%s failed to load: %s", self.model.name, exc)
            await self.stop()
            self.state = "failed"
        finally:
            self.loaded.set()

    async def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                assert self._process is not None, "load() started it"
                if self._process.poll() is not None:
                    raise RuntimeError(f"its server exited with status {self._process.returncode} (its log is above)")
                try:
                    if (await client.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        raise TimeoutError(f"it did not answer /health within {timeout:.0f} s")

    async def stop(self) -> None:
        process, self._process = self._process, None
        self.state = "unloaded"
        if process is None or process.poll() is not None:
            return
        logger.info("unloading %s", self.model.name)
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
