"""`llmctl serve`'s app under a real uvicorn on 127.0.0.1, in this process, around an engine the
test holds: the test can look at the engine's KV blocks and inject a fault into its model step."""

from __future__ import annotations

import time

from helpers.server_helpers import ThreadedUvicorn
from llmctl.engine.front.llm_engine import LLMEngine
from llmctl.server.app import ServerSettings, create_app


class InProcessServer(ThreadedUvicorn):
    def __init__(self, engine: LLMEngine, **settings) -> None:
        self.engine = engine
        app = create_app(ServerSettings(engine.config, ["test-model"], **settings), engine=engine)
        self.state = app.state.llmctl
        super().__init__(app)

    def __enter__(self) -> InProcessServer:
        self.start(ready=lambda: self.state.engine is not None and self.state.engine.is_running)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
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
