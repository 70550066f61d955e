"""Errors of /v1/messages in Anthropic's shape: {"type": "error", "error": {"type", "message"}}, the
error type named by its HTTP status as Anthropic names them (what the anthropic SDK maps to its
exception classes)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from llmctl.server.protocol import APIError

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def anthropic_error_response(error: APIError) -> JSONResponse:
    return JSONResponse(anthropic_error_body(error), status_code=error.status, headers=error.headers)
