"""User-facing errors: each says what went wrong and what to do about it."""

from __future__ import annotations

import os


class LlmctlError(Exception):
    """A mistake or missing resource the user can fix; shown without a traceback."""

    exit_code = 2


class ModelNotFoundError(LlmctlError):
    pass


class ModelAccessError(LlmctlError):
    """Gated or private repositories, or missing credentials."""


class OfflineError(LlmctlError):
    """The hub cannot be reached and nothing usable is cached."""


class CorruptModelError(LlmctlError):
    """A model file exists but cannot be parsed."""


class UnsupportedModelError(LlmctlError):
    pass


class SettingError(LlmctlError):
    """An environment variable llmctl reads holds a value it cannot use."""


class InternalError(RuntimeError):
    """A bug of llmctl's, reported from somewhere its traceback cannot travel (a worker rank)."""


def debug_enabled() -> bool:
    """LLMCTL_DEBUG=1: tracebacks for internal errors, wherever they happen."""
    return os.environ.get("LLMCTL_DEBUG", "") not in ("", "0")
