"""The engine's errors, in one place: the user's (LlmctlError: a setting or request that cannot work, said in
one line) and the engine's own (a step, a rank, a device or the loop failing). The server maps each to an
HTTP status (llmctl.server.app)."""

from __future__ import annotations

from llmctl.errors import LlmctlError


class EngineConfigError(LlmctlError):
    """A setting that cannot work; the message names the flag and a value that does."""


class SpeculativeConfigError(LlmctlError):
    """A --speculative-config that cannot work; the message names the key and what to use."""


class AdapterError(LlmctlError):
    """An adapter that cannot run on this base model; the message names the problem."""


class InvalidRequestError(LlmctlError):
    """A request setting is out of range; the message names the parameter."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelAsleepError(LlmctlError):
    """A request while sleep mode holds the model asleep (503): the message says how to wake it."""


class SleepConflictError(LlmctlError):
    """Sleep asked of a model with requests still running, or asleep already (409)."""


class StepFailedError(RuntimeError):
    """A model step raised: its requests were aborted (blocks freed); other requests are unaffected."""

    def __init__(self, request_ids: list[str], cause: Exception) -> None:
        super().__init__(f"the model step failed: {type(cause).__name__}: {cause}")
        self.request_ids = request_ids


class DeviceFailedError(RuntimeError):
    """A CUDA error in a model step. CUDA errors are sticky (the context is unusable afterwards), so
    the engine stops: /health turns 503 and every request in flight gets the error."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an unexpected error; no request can be served."""


class WorkerLostError(RuntimeError):
    """A rank died or stopped answering: the engine cannot go on."""


class RemoteStepError(Exception):
    """A step failed on another rank for its requests' sake (the ranks go on)."""
