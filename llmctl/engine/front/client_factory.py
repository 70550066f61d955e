"""The EngineClient the server talks to, built from its config: one engine behind the async client, or the
--dp replicas behind one (llmctl.engine.front.data_parallel)."""

from __future__ import annotations

from typing import Any

from llmctl.engine.config import EngineConfig
from llmctl.engine.front.engine_client import EngineClient

InProcessEngine = Any  # an LLMEngine the caller built (tests serve one in-process); wrapped in the async client


def open_engine_client(config: EngineConfig, engine: InProcessEngine | None = None) -> EngineClient:
    """The client around `engine` when given, else one engine or its --dp replicas."""
    from llmctl.engine.front.async_engine import AsyncLLMEngine
    from llmctl.engine.front.data_parallel import create_engine_client

    return AsyncLLMEngine(engine) if engine is not None else create_engine_client(config)
