"""`llmctl serve`: settings from the command line, the app, uvicorn with graceful shutdown."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from llmctl.engine.errors import WorkerLostError
from llmctl.errors import LlmctlError
from llmctl.server.app import ServerSettings, create_app
from llmctl.server.listener import Listener

if TYPE_CHECKING:
    import uvicorn

logger = logging.getLogger("llmctl.server")
GRACEFUL_SHUTDOWN_SECONDS = 30  # SIGTERM: in-flight requests get this long to finish


JINJA_MARKS = ("{", "}", "\n")  # vLLM's test: a --chat-template value holding one is the template itself


def load_chat_template(value: str | None) -> str | None:
    """A file path, the name of a template shipped in llmctl/templates (chatml, bloom), or, as vLLM takes it,
    the Jinja template itself."""
    if value is None:
        return None
    path = Path(value)
    if path.is_file():
        return path.read_text()
    if any(mark in value for mark in JINJA_MARKS):
        return value
    from llmctl.checkpoint.tokenizer import builtin_template

    try:
        return builtin_template(value)
    except Exception:
        raise LlmctlError(f"--chat-template {value!r} is neither a file, a built-in template (chatml, bloom) nor "
                          "a Jinja template") from None


def graceful_server_class() -> type[uvicorn.Server]:  # uvicorn is imported lazily: `llmctl inspect` never pays for it
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """SIGTERM/SIGINT stop accepting, let in-flight requests finish, then exit 0 (uvicorn's own
        handler re-raises the signal after shutdown, which makes the process exit with -15)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer


def serve(settings: ServerSettings, listener: Listener) -> int:
    import uvicorn

    from llmctl.logs import configure_logging

    configure_logging()
    failure: list[BaseException] = []
    server: uvicorn.Server | None = None  # set below; stop() may run before on a fast failure

    def stop(exc: BaseException) -> None:
        failure.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_load_failure=stop)
    server = graceful_server_class()(uvicorn.Config(app, log_level="warning", **listener.uvicorn_options(),
                                                     timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS))
    logger.info("serving %s on %s (OpenAI API under /v1)", settings.served_model_names[0], listener.url())
    server.run()
    if failure:
        raise startup_failure(failure[0])
    return 0


def startup_failure(exc: BaseException) -> BaseException:
    """A user's mistake or a lost rank as a one-line error; any other exception is llmctl's bug and goes
    up as it is, so the CLI reports it as internal (with its traceback under LLMCTL_DEBUG=1)."""
    if isinstance(exc, WorkerLostError):
        return LlmctlError(str(exc))
    return exc
