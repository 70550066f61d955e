"""Request validation for the OpenAI API: every mistake becomes a 4xx with a clear message.

The request bodies are plain JSON objects; each field is checked by type and range here
(the names and ranges are OpenAI's and vLLM's), so handlers only see well-formed values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmctl.engine.sampling_params import MAX_LOGPROBS, InvalidRequestError, SamplingParams


class APIError(Exception):
    """An error answered with an OpenAI-shaped body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.error_type = error_type or {400: "invalid_request_error", 401: "authentication_error",
                                         404: "not_found_error", 503: "service_unavailable"}.get(
            status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code if self.code is not None else self.status}}


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, param)


# Fields vLLM accepts that we accept and ignore, and ones we refuse with a clear message.
IGNORED = {"user", "stream_options", "service_tier", "store", "metadata", "parallel_tool_calls"}
UNSUPPORTED = {"tools": "tool calling", "tool_choice": "tool calling", "functions": "function calling",
               "function_call": "function calling", "response_format": "structured output (response_format)",
               "logit_bias": "logit_bias", "suffix": "suffix", "best_of": "best_of > 1",
               "audio": "audio output", "modalities": "non-text modalities", "prediction": "predicted outputs",
               "guided_json": "guided decoding", "guided_regex": "guided decoding"}


class Fields:
    """Typed access to a JSON object's fields, naming the field in every error."""

    def __init__(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        self.body = body

    def _get(self, name: str, types: tuple[type, ...], kind: str, default: Any) -> Any:
        value = self.body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in types:
            raise bad(f"{name} must be {kind}, got a boolean", name)
        if not isinstance(value, types):
            raise bad(f"{name} must be {kind}, got {type(value).__name__}", name)
        return value

    def int(self, name: str, default: int | None = None) -> int | None:
        value = self._get(name, (int, float), "an integer", default)
        if isinstance(value, float):
            if not value.is_integer():
                raise bad(f"{name} must be an integer, got {value}", name)
            value = int(value)
        return value

    def float(self, name: str, default: float | None = None) -> float | None:
        value = self._get(name, (int, float), "a number", default)
        return None if value is None else float(value)

    def bool(self, name: str, default: bool = False) -> bool:
        return self._get(name, (bool,), "true or false", default)

    def str(self, name: str, default: str | None = None) -> str | None:
        return self._get(name, (str,), "a string", default)

    def raw(self, name: str, default: Any = None) -> Any:
        return self.body.get(name, default)


def refuse_unsupported(fields: Fields) -> None:
    for name, what in UNSUPPORTED.items():
        value = fields.body.get(name)
        if value in (None, [], {}) or (name == "best_of" and value == 1):
            continue
        raise bad(f"{name} is not supported: llmctl does not implement {what} yet", name)


def stop_strings(fields: Fields) -> list[str]:
    stop = fields.raw("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 16:
            raise bad("stop may hold at most 16 strings", "stop")
        return stop
    raise bad("stop must be a string or a list of strings", "stop")


def int_list(fields: Fields, name: str) -> list[int]:
    value = fields.raw(name)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise bad(f"{name} must be a list of integers", name)


@dataclass
class SamplingRequest:
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool = False


def sampling_request(fields: Fields, *, chat: bool) -> SamplingRequest:
    """The sampling fields shared by /v1/completions and /v1/chat/completions."""
    refuse_unsupported(fields)
    max_tokens = fields.int("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = fields.int("max_tokens")
    if max_tokens is not None and max_tokens <= 0:
        raise bad(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    logprobs, top_logprobs = _logprobs(fields, chat)
    stream = fields.bool("stream")
    options = fields.raw("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options")
    try:
        params = SamplingParams(
            n=fields.int("n", 1),
            temperature=fields.float("temperature"),
            top_p=fields.float("top_p"),
            top_k=fields.int("top_k"),
            min_p=fields.float("min_p", 0.0),
            seed=fields.int("seed"),
            repetition_penalty=fields.float("repetition_penalty"),
            presence_penalty=fields.float("presence_penalty", 0.0),
            frequency_penalty=fields.float("frequency_penalty", 0.0),
            stop=stop_strings(fields),
            stop_token_ids=int_list(fields, "stop_token_ids"),
            include_stop_str_in_output=fields.bool("include_stop_str_in_output"),
            ignore_eos=fields.bool("ignore_eos"),
            max_tokens=max_tokens,
            min_tokens=fields.int("min_tokens", 0),
            logprobs=top_logprobs if logprobs else None,
            prompt_logprobs=fields.int("prompt_logprobs"),
            skip_special_tokens=fields.bool("skip_special_tokens", True),
        )
    except InvalidRequestError as exc:
        raise bad(str(exc), exc.param) from None
    include_usage = bool(options and options.get("include_usage"))
    return SamplingRequest(params, stream, include_usage, echo=fields.bool("echo"))


def _logprobs(fields: Fields, chat: bool) -> tuple[bool, int]:
    if chat:  # chat: logprobs is a boolean, top_logprobs the number of alternatives
        wanted = fields.bool("logprobs")
        top = fields.int("top_logprobs", 0) or 0
        if not 0 <= top <= MAX_LOGPROBS:
            raise bad(f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {top}", "top_logprobs")
        if top and not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return wanted, top
    count = fields.int("logprobs")  # completions: logprobs is the number of alternatives
    if count is None:
        return False, 0
    if not 0 <= count <= MAX_LOGPROBS:
        raise bad(f"logprobs must be between 0 and {MAX_LOGPROBS}, got {count}", "logprobs")
    return True, count


def completion_prompts(fields: Fields) -> list[str | list[int]]:
    return prompt_list(fields.raw("prompt"), "prompt")


MAX_PROMPTS_PER_REQUEST = 1024


def prompt_list(value: Any, param: str) -> list[str | list[int]]:
    """OpenAI's prompt/input forms: a string, a list of strings, token ids, or a list of token-id lists."""
    prompts = _prompt_forms(value, param)
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        raise bad(f"{param} holds {len(prompts)} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request: split the "
                  "batch", param)
    return prompts


def _prompt_forms(value: Any, param: str) -> list[str | list[int]]:
    if value is None:
        raise bad(f"{param} is required", param)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(p, str) for p in value):
            return list(value)
        if all(_is_token(t) for t in value):
            return [list(value)]
        if all(isinstance(p, list) and p and all(_is_token(t) for t in p) for p in value):
            return [list(p) for p in value]
    raise bad(f"{param} must be a non-empty string, list of strings, list of token ids or list of token-id lists",
              param)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def chat_messages(fields: Fields) -> list[dict[str, str]]:
    """messages with roles system/user/assistant (also developer/tool) and string or text-part content."""
    messages = fields.raw("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages")
    result = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(f"{where} must be an object with role and content", "messages")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "developer", "tool"):
            raise bad(f"{where}.role must be system, user or assistant, got {role!r}", "messages")
        result.append({"role": "system" if role == "developer" else role,
                       "content": _content_text(message.get("content"), where)})
    return result


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}.content: only text parts are supported, got {kind!r}", "messages")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad(f"{where}.content must be a string or a list of text parts", "messages")
