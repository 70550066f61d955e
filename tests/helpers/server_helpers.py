"""Start `llmctl serve` as a real process on a free 127.0.0.1 port and wait until it is healthy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    lines: list[str] = field(default_factory=list)  # the server's output, drained as it comes

    def __post_init__(self) -> None:
        # read the pipe all the time: a pipe read only at stop fills up and blocks a chatty server
        self._drain = threading.Thread(target=self._read_output, daemon=True)
        self._drain.start()

    def _read_output(self) -> None:
        if self.process.stdout is None:  # a process whose output goes to a file
            return
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def log(self) -> str:
        """Everything the server printed; complete once stop() has returned."""
        return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._drain.join(timeout=10)
        return code


def terminate_all(processes: list[subprocess.Popen], timeout: float = 60) -> None:
    """SIGTERM to every process (torchrun passes it to its ranks), then wait; kill what outlives the timeout."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(*args: str, timeout: float = 120, health: Callable[[Server], int] | None = None,
                 unset: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Server:
    """health(server) -> the /health status, for servers plain urllib cannot reach (TLS, a Unix socket);
    `unset`: environment variables of the test run the server must not see; `env`: more it sees."""
    port = free_port()
    env = {name: value for name, value in os.environ.items() if name not in unset} | {"PYTHONUNBUFFERED": "1"} | \
        (env or {})
    process = subprocess.Popen([sys.executable, "-m", "llmctl", "serve", *args, "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    server = Server(process, port)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            server.stop()
            raise RuntimeError(f"server exited with {process.returncode}: {server.log}")
        try:
            status = health(server) if health else server.get("/health")[0]
            if status == 200:
                return server
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError("server did not become healthy in time")


class ThreadedUvicorn:
    """An ASGI app under a real uvicorn on a free 127.0.0.1 port, on a thread of this process."""

    def __init__(self, app) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready=lambda: True, timeout: float = 60) -> None:
        self.thread.start()
        deadline = time.time() + timeout
        while not (self.server.started and ready()):
            if time.time() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def post(server, path: str, body: bytes | str | dict, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    request = urllib.request.Request(server.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def metrics(server) -> dict[str, float]:
    _, text = server.get("/metrics")
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values
