"""`llmctl serve`'s app under a real uvicorn on 127.0.0.1, in this process, around an engine the
test holds: the test can look at the engine's KV blocks and inject a fault into its model step."""

from __future__ import annotations

import threading
import time

import uvicorn

from llmctl.engine.llm_engine import LLMEngine
from llmctl.server.app import ServerSettings, create_app
from server_helpers import free_port


class InProcessServer:
    def __init__(self, engine: LLMEngine, **settings) -> None:
        self.engine = engine
        app = create_app(ServerSettings(engine.config, ["test-model"], **settings), engine=engine)
        self.state = app.state.llmctl
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.time() + 60
        while not (self.server.started and self.state.engine is not None and self.state.engine.is_running):
            if time.time() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.state.engine.shutdown()

    def wait_idle(self, timeout: float = 30) -> bool:
        """True once the engine holds no request and every KV block is free again."""
        manager = self.engine.block_manager
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.engine.has_unfinished_requests and manager.num_free_blocks == manager.num_blocks:
                return True
            time.sleep(0.05)
        return False
