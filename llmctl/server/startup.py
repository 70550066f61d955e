"""The server's start: the engine (or an embedding model) loaded on a background thread, the
--lora-modules and the chat template; and the watch that stops the server when ranks are lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmctl.engine.errors import WorkerLostError
from llmctl.engine.front.client_factory import InProcessEngine, open_engine_client
from llmctl.engine.multimodal.processor import multimodal_processor
from llmctl.errors import LlmctlError, debug_enabled
from llmctl.server.chat import chat_template
from llmctl.server.embeddings import load_encoder
from llmctl.server.harmony_prompt import uses_harmony
from llmctl.server.lora import AdapterLoadError
from llmctl.server.state import ServerState

logger = logging.getLogger("llmctl.server")
OnFailure = Callable[[BaseException], None]


def load_engine(state: ServerState, engine: InProcessEngine | None, on_load_failure: OnFailure | None) -> None:
    """On the loading thread: the encoder or the engine, the --lora-modules, the chat template."""
    try:
        if engine is None and load_encoder(state):
            return
        client = open_engine_client(state.settings.engine_config, engine)
        # the processor and the template before the engine is published: /health is 200 from then on
        state.multimodal = multimodal_processor(client.source.path, client.spec.model_type,
                                                state.settings.engine_config.multimodal)
        state.harmony = uses_harmony(client)
        if state.harmony and state.settings.chat_template is not None:
            logger.warning("--chat-template is not used: %s chats are rendered in harmony by openai-harmony, as "
                           "vLLM renders gpt-oss's", state.model_name)
        state.template = chat_template(state.settings.chat_template, client) if client.pooler is None else None
        if state.template is None and client.pooler is None and not state.harmony:
            logger.warning("%s has no chat template: /v1/chat/completions will answer 400 until the server is "
                           "started with --chat-template (a file, or chatml / bloom)", state.model_name)
        state.engine = client
        load_static_adapters(state)
    except Exception as exc:  # reported by /health and the serve command
        state.load_error = str(exc)
        logger.error("engine failed to start: %s", exc, exc_info=exc if debug_enabled() else None)
        if on_load_failure is not None:
            on_load_failure(exc)


def load_static_adapters(state: ServerState) -> None:
    """--lora-modules: each is read and checked now; one that does not fit stops the server."""
    for module in state.settings.lora_modules:
        try:
            state.adapters.load(state.ready_engine, module.name, module.path, module.base_model_name)
        except AdapterLoadError as exc:
            raise LlmctlError(f"--lora-modules {module.name}={module.path}: {exc}") from None


async def exit_when_ranks_are_lost(state: ServerState, stop: OnFailure | None) -> None:
    """A lost worker rank cannot come back: once in-flight requests have their errors, stop the
    server with a failure so a supervisor restarts it (a single-process engine stays up, 503)."""
    while True:
        await asyncio.sleep(0.5)
        if state.engine is None or stop is None:
            continue
        reason = state.engine.lost_workers()
        if reason is not None:
            logger.error("engine ranks lost (%s): failing in-flight requests and stopping", reason)
            await asyncio.sleep(1.0)  # let the error responses of in-flight requests go out
            stop(WorkerLostError(f"a worker rank was lost: {reason}"))
            return
