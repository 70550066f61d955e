"""One routed model's `llmctl serve` process on 127.0.0.1: started on demand (its /health polled until it answers
200, or it exits, or the load times out), stopped with SIGTERM (its in-flight requests finish first); with a sleep
level, put to sleep instead (its own POST /sleep, vLLM's sleep mode: the process stays, its memory goes back) and
woken (POST /wake_up) on its next use."""

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
    sleep_level: int = 0  # 1 or 2: put to sleep at that level rather than stopped; 0: stopped
    state: str = "unloaded"  # unloaded | loading | loaded | sleeping | failed
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
        flags = (*self.shared_flags, *self.model.flags)
        sleep = ["--enable-sleep-mode"] if self.sleep_level and "--enable-sleep-mode" not in flags else []
        return [sys.executable, "-m", "llmctl", "serve", *model, "--served-model-name", self.model.name,
                *flags, *sleep, "--host", "127.0.0.1", "--port", str(self.port)]

    def start_loading(self, timeout: float) -> None:
        """It is "loading" from now; a task starts it (or wakes it, when it sleeps) and sets `loaded` when that
        ends, one way or the other."""
        waking = self.state == "sleeping"
        self.state, self.error = "loading", None
        if not waking:
            self.port = _free_port()
        self.loaded.clear()
        # held: a task nobody references may be collected
        self._task = asyncio.create_task(self._wake(timeout) if waking else self._load(timeout))

    async def sleep(self) -> None:
        """Its engine put to sleep at the process's level; an error if its server refuses."""
        async with httpx.AsyncClient(timeout=STOP_SECONDS) as client:
            answer = await client.post(f"{self.url}/sleep", params={"level": self.sleep_level})
        if answer.status_code != 200:
            raise RuntimeError(f"POST /sleep answered {answer.status_code}: {answer.text[:200]}")
        self.state = "sleeping"
        logger.info("%s put to sleep (level %d)", self.model.name, self.sleep_level)

    async def _wake(self, timeout: float) -> None:
        started = time.perf_counter()
        try:
            async with httpx.AsyncClient(timeout=timeout) as client:
                answer = await client.post(f"{self.url}/wake_up")
            if answer.status_code != 200:
                raise RuntimeError(f"POST /wake_up answered {answer.status_code}: {answer.text[:200]}")
            self.state = "loaded"
            logger.info("%s woken in %.1f s", self.model.name, time.perf_counter() - started)
        except Exception as exc:
            logger.error("%s failed to wake: %s", self.model.name, exc)
            await self.stop()
            self.state, self.error = "failed", f"it did not wake: {exc}"
        finally:
            self.loaded.set()

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
