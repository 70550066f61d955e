"""A data-parallel replica in its own process (`--data-parallel-backend mp`, vLLM's default): the process
holds a whole LLMEngine (its scheduler, sampler and model; with TP × PP > 1 it spawns its own ranks), so the
replicas' Python work — scheduling, sampling, detokenizing their outputs' tokens — runs side by side instead
of taking turns under one interpreter lock, as vLLM runs an engine-core process per DP rank.

The API server talks to it over a pipe: one (method, arguments) message per call and one answer, in order.
The replica ignores Ctrl-C (the server stops it) and exits when the pipe closes, so it never outlives the
server; a replica that dies makes its next call raise WorkerLostError.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from multiprocessing.connection import Connection
from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.remote_replica import RemoteReplicaEngine, ReplicaServer

logger = logging.getLogger("llmctl.engine")

SHUTDOWN_SECONDS = 30


class ProcessReplicaEngine(RemoteReplicaEngine):
    """The LLMEngine surface AsyncLLMEngine uses, over a ReplicaServer in a child process."""

    def __init__(self, config: EngineConfig, index: int) -> None:
        super().__init__()
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch or threads
        self._pipe, child = context.Pipe()
        self._lock = threading.Lock()  # the engine thread and the server's handlers both call
        level = logging.getLogger("llmctl").getEffectiveLevel()
        self.process = context.Process(target=serve_replica, args=(child, config, level),
                                       name=f"llmctl-dp-replica-{index}")
        self.process.start()
        child.close()
        self.index = index

    def ready(self) -> ProcessReplicaEngine:
        """Once the replica has loaded its model (its own error, such as a model that does not fit, raised here)."""
        self._take_facts()
        logger.info("data-parallel replica %d in process %d", self.index, self.process.pid)
        return self

    def _invoke(self, method: str, *args: Any) -> Any:
        if self._lost is not None:
            raise WorkerLostError(self._lost)
        with self._lock:
            try:
                self._pipe.send((method, args))
                ok, value = self._pipe.recv()
            except (EOFError, OSError):
                self.process.join(timeout=5)
                self._lost = f"data-parallel replica {self.index}'s process exited (code {self.process.exitcode})"
                raise WorkerLostError(self._lost) from None
        if not ok:
            raise value
        return value

    def _healthy(self) -> bool:
        """A replica process that exited is lost even before a call finds it (an idle replica makes none)."""
        if self._lost is None and not self.process.is_alive():
            self._lost = f"data-parallel replica {self.index}'s process exited (code {self.process.exitcode})"
        return self._lost is None

    def _shutdown(self) -> None:
        if self._lost is None:
            try:
                self._invoke("shutdown")
            except Exception:  # already gone: nothing to stop
                pass
        self._pipe.close()
        self.process.join(timeout=SHUTDOWN_SECONDS)
        if self.process.is_alive():
            self.process.kill()


def serve_replica(pipe: Connection, config: EngineConfig, log_level: int) -> None:
    """The replica process: load the engine, then answer the API server's calls until shutdown or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops the replica
    from llmctl.logs import configure_logging

    configure_logging()
    logging.getLogger("llmctl").setLevel(log_level)
    try:
        server = ReplicaServer(config)
    except Exception as exc:  # the first call (facts) gets the reason
        _answer_until_closed(pipe, None, exc)
        return
    _answer_until_closed(pipe, server, None)


def _answer_until_closed(pipe: Connection, server: ReplicaServer | None, failed: Exception | None) -> None:
    while True:
        try:
            method, args = pipe.recv()
        except (EOFError, OSError):
            return  # the API server is gone
        try:
            if server is None:
                raise failed  # type: ignore[misc]
            answer = (True, getattr(server, method)(*args))
        except Exception as exc:
            answer = (False, _sendable(exc))
        try:
            pipe.send(answer)
        except (EOFError, OSError):
            return
        if method == "shutdown" or server is None:
            return


def _sendable(exc: Exception) -> Exception:
    """The error as it is where it pickles, else its type and message as a RuntimeError."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def process_replicas(configs: list[EngineConfig]) -> list[ProcessReplicaEngine]:
    """A process per replica, loading side by side; every one ready, or all stopped and the first error raised."""
    replicas = [ProcessReplicaEngine(config, index) for index, config in enumerate(configs)]
    try:
        return [replica.ready() for replica in replicas]
    except BaseException:
        for replica in replicas:
            replica._shutdown()
        raise
