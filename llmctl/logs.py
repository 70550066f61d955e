"""Log lines on stderr in vLLM's startup-log shape, unless the application set up logging."""

from __future__ import annotations

import logging


def configure_logging() -> None:
    package = logging.getLogger("llmctl")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", datefmt="%m-%d %H:%M:%S"))
    package.addHandler(handler)
    package.setLevel(logging.INFO)
