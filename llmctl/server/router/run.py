"""`llmctl serve --models …`: the router on the listener, each model's server started by it on 127.0.0.1."""

from __future__ import annotations

import logging
import sys

from llmctl.errors import LlmctlError
from llmctl.server.listener import Listener
from llmctl.server.router.app import create_router_app
from llmctl.server.router.catalog import parse_models
from llmctl.server.router.pool import ModelPool
from llmctl.server.serve import GRACEFUL_SHUTDOWN_SECONDS, graceful_server_class

logger = logging.getLogger("llmctl.server")
ROUTER_FLAGS = {flag: 1 for flag in (  # the router's own flags (each takes one value): not given to the models' servers
    "--models", "--max-loaded-models", "--model-load-timeout", "--model-sleep-level", "--host", "--port", "--uds", "--ssl-keyfile",
    "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs", "--root-path")}


def shared_flags(argv: list[str]) -> tuple[str, ...]:
    """The `llmctl serve` flags every model's server gets: the command line's, but the router's own."""
    words, shared, index = argv[argv.index("serve") + 1:], [], 0
    while index < len(words):
        flag = words[index].split("=", 1)[0]
        if flag in ROUTER_FLAGS:
            index += 1 + (0 if "=" in words[index] else ROUTER_FLAGS[flag])
            continue
        shared.append(words[index])
        index += 1
    return tuple(shared)


def serve_router(models: list[str], listener: Listener, max_loaded: int, load_timeout: float,
                 api_key: str | None, sleep_level: int = 0) -> int:
    import uvicorn

    from llmctl.logs import configure_logging

    configure_logging()
    if max_loaded < 1:
        raise LlmctlError(f"--max-loaded-models must be at least 1 (got {max_loaded})")
    if sleep_level not in (0, 1, 2):
        raise LlmctlError(f"--model-sleep-level is 1 (weights kept in CPU memory), 2 (weights read again on waking) "
                          f"or 0 (idle models stopped); got {sleep_level}")
    routed = parse_models(models)
    pool = ModelPool(routed, shared_flags(sys.argv), max_loaded, load_timeout, sleep_level)
    server = graceful_server_class()(uvicorn.Config(create_router_app(pool, api_key), log_level="warning",
                                                    **listener.uvicorn_options(),
                                                    timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS))
    logger.info("routing %s on %s by each request's model (at most %d loaded at once; the least recently used %s)",
                ", ".join(model.name for model in routed), listener.url(), max_loaded,
                f"put to sleep at level {sleep_level}" if sleep_level else "stopped")
    server.run()
    return 0
