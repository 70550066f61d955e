"""Request validation for the OpenAI API: every mistake becomes a 4xx with a clear message.

The request bodies are plain JSON objects; each field is checked by type and range here
(the names and ranges are OpenAI's and vLLM's), so handlers only see well-formed values.
"""

from __future__ import annotations

import builtins
import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from llmctl.engine.errors import InvalidRequestError
from llmctl.engine.sampling_params import RANGES, SamplingParams

logger = logging.getLogger("llmctl.server")


# A value parsed from a request's JSON: dynamically typed until Fields and the readers below check it at run time
# (a recursive union would make every handler re-prove what those checks already did).
JSON = Any


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


MAX_PROMPTS_PER_REQUEST = 1024

# Fields vLLM accepts that we accept and ignore, and ones we refuse with a clear message.
IGNORED = {"user", "service_tier", "store", "metadata"}
READ_BESIDE = {"guided_decoding_backend"}  # read, but not published: it may only name the server's backend
UNSUPPORTED = {"functions": "function calling (the deprecated form; see tools)",
               "function_call": "function calling (the deprecated form; see tool_choice)", "suffix": "suffix",
               "best_of": "best_of > 1", "audio": "audio output", "modalities": "non-text modalities",
               "prediction": "predicted outputs"}
UNSUPPORTED_DEFAULTS = {"best_of": 1}  # values that ask for nothing


class Fields:
    """Typed access to a JSON object's fields, naming the field in every error."""

    def __init__(self, body: JSON) -> None:
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        self.body = body

    def _get(self, name: str, types: tuple[type, ...], kind: str, default: JSON) -> JSON:
        value = self.body.get(name, default)
        if value is None:
            return default
        if isinstance(value, bool) and bool not in types:
            raise bad(f"{name} must be {kind}, got a boolean", name)
        if not isinstance(value, types):
            raise bad(f"{name} must be {kind}, got {type(value).__name__}", name)
        return value

    def raw(self, name: str, default: JSON = None) -> JSON:
        return self.body.get(name, default)

    def typed(self, name: str, spec: FieldSpec) -> Any:
        """The field read as its FieldSpec declares it."""
        readers: dict[str, Callable[[str, Any], Any]] = {"integer": self.int, "number": self.float,
                                                         "boolean": self.bool, "string": self.str}
        return readers[spec.kind](name, spec.default)

    def int(self, name: str, default: int | None = None) -> int | None:
        value = self._get(name, (int, float), "an integer", default)
        if isinstance(value, float) and not value.is_integer():
            raise bad(f"{name} must be an integer, got {value}", name)
        return None if value is None else int(value)

    def float(self, name: str, default: float | None = None) -> float | None:
        value = self._get(name, (int, float), "a number", default)
        return None if value is None else float(value)

    def bool(self, name: str, default: bool = False) -> bool:
        return bool(self._get(name, (bool,), "true or false", default))

    def optional_bool(self, name: str) -> builtins.bool | None:
        """true, false, or None when the field is absent (the model's own default then)."""
        value = self._get(name, (bool,), "true or false", None)
        return None if value is None else bool(value)

    def str(self, name: str, default: str | None = None) -> str | None:  # last: it shadows the type str below
        value = self._get(name, (str,), "a string", default)
        return None if value is None else str(value)


def warn_ignored(fields: Fields, known: Collection[str]) -> None:
    """Fields llmctl does not know are accepted and named in the log, as vLLM does."""
    ignored = sorted(set(fields.body) - set(known) - IGNORED - set(UNSUPPORTED) - READ_BESIDE)
    if ignored:
        logger.warning("The following fields were present in the request but ignored: %s", ", ".join(ignored))


def refuse_unsupported(fields: Fields) -> None:
    for name, what in UNSUPPORTED.items():
        value = fields.body.get(name)
        if value in (None, [], {}) or (name in UNSUPPORTED_DEFAULTS and value == UNSUPPORTED_DEFAULTS[name]
                                       and type(value) is type(UNSUPPORTED_DEFAULTS[name])):
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


def logit_bias(fields: Fields) -> dict[int, float] | None:
    """OpenAI's {"token id": bias}; biases clamped to [-100, 100] as vLLM does."""
    value = fields.raw("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("logit_bias must be an object mapping token ids to biases", "logit_bias")
    bias = {}
    for token, amount in value.items():
        if not (isinstance(token, str) and token.strip().lstrip("-").isdigit()):
            raise bad(f"logit_bias keys must be token ids, got {token!r}", "logit_bias")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount != amount:
            raise bad(f"logit_bias[{token!r}] must be a number", "logit_bias")
        bias[int(token)] = min(100.0, max(-100.0, float(amount)))
    return bias or None


def string_list(fields: Fields, name: str) -> list[str]:
    value = fields.raw(name)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise bad(f"{name} must be a list of strings", name)


def int_list(fields: Fields, name: str) -> list[int]:
    value = fields.raw(name)
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    raise bad(f"{name} must be a list of integers", name)


@dataclass(frozen=True)
class FieldSpec:
    """A request field as the validator reads it and as /openapi.json publishes it."""

    kind: str  # JSON type: integer | number | boolean | string, or "custom" (schema given)
    description: str
    default: Any = None
    schema: dict[str, Any] | None = None  # for custom fields

    def json_schema(self, name: str) -> dict[str, Any]:
        schema: dict[str, Any] = dict(self.schema) if self.schema else {"type": self.kind}
        if name in RANGES and self.kind in ("integer", "number"):
            schema.update(RANGES[name].json_schema())
        if self.default is not None:
            schema["default"] = self.default
        return {**schema, "description": self.description}


_STRINGS = {"type": "array", "items": {"type": "string"}}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}

# The sampling fields both generation endpoints read into SamplingParams (ranges: RANGES).
SAMPLING_FIELDS: dict[str, FieldSpec] = {
    "n": FieldSpec("integer", "completions to generate for each prompt", 1),
    "temperature": FieldSpec("number", "sampling temperature; 0 is greedy (default: the model's generation_config)"),
    "top_p": FieldSpec("number", "nucleus sampling: keep the most likely tokens up to this probability mass"),
    "top_k": FieldSpec("integer", "keep the k most likely tokens; 0 or -1: off"),
    "min_p": FieldSpec("number", "drop tokens less likely than min_p times the most likely one", 0.0),
    "seed": FieldSpec("integer", "seed for reproducible sampling of this request"),
    "repetition_penalty": FieldSpec("number", "divide logits of tokens seen in prompt or output (transformers' rule)"),
    "presence_penalty": FieldSpec("number", "subtracted from logits of tokens already generated", 0.0),
    "frequency_penalty": FieldSpec("number", "subtracted per occurrence of a token already generated", 0.0),
    "include_stop_str_in_output": FieldSpec("boolean", "keep the matched stop string in the text", False),
    "ignore_eos": FieldSpec("boolean", "keep generating past the end-of-sequence token", False),
    "min_tokens": FieldSpec("integer", "tokens to generate before EOS or stop tokens may end the output", 0),
    "priority": FieldSpec("integer", "with --scheduling-policy priority: lower runs first (vLLM's field)", 0),
    "prompt_logprobs": FieldSpec("integer", "log-probabilities of each prompt token, with this many alternatives "
                                 "(answered as vLLM's prompt_logprobs; not with stream)"),
    "skip_special_tokens": FieldSpec("boolean", "leave special tokens out of the text", True),
    "disable_spec_decode": FieldSpec("boolean", "decode this request one token per step on a server started "
                                     "with --speculative-config", False),
}

# Fields read by their own parsers below; their schemas are published beside them.
COMMON_FIELDS: dict[str, FieldSpec] = {
    "logit_bias": FieldSpec("custom", "token id → bias added to its logit (clamped to -100…100)", schema={
        "type": "object", "additionalProperties": {"type": "number"}}),
    "allowed_token_ids": FieldSpec("custom", "only these token ids may be generated (vLLM's field)",
                                   schema=_TOKEN_IDS),
    "bad_words": FieldSpec("custom", "words that must not be generated (vLLM's field)", schema=_STRINGS),
    "model": FieldSpec("string", "a served model name (default: the first)"),
    "max_tokens": FieldSpec("integer", "most tokens to generate (completions default 16; chat: up to the context)"),
    "stream": FieldSpec("boolean", "send server-sent events as tokens are generated", False),
    "stream_options": FieldSpec("custom", "include_usage: a last chunk with token counts; continuous_usage_stats: "
                                "usage in every chunk (vLLM's)", schema={
        "type": "object", "properties": {"include_usage": {"type": "boolean"},
                                         "continuous_usage_stats": {"type": "boolean"}}}),
    "stop": FieldSpec("custom", "up to 16 strings that end the output", schema={
        "anyOf": [{"type": "string"}, {**_STRINGS, "maxItems": 16}]}),
    "stop_token_ids": FieldSpec("custom", "token ids that end the output", schema=_TOKEN_IDS),
    "use_beam_search": FieldSpec("boolean", "vLLM's beam search: n beams, best first", False),
    "length_penalty": FieldSpec("number", "beam search: score = cumulative logprob / length ** this", 1.0),
}
_SCHEMA_OBJECT = {"type": "object"}
# Structured outputs (llmctl.server.structured): at most one of these per request
STRUCTURED_FIELDS: dict[str, FieldSpec] = {
    "response_format": FieldSpec("custom", "text (no constraint), json_object, json_schema (its `schema`), or vLLM's "
                                 "structural_tag", schema={"type": "object", "required": ["type"], "properties": {
                                     "type": {"enum": ["text", "json_object", "json_schema", "structural_tag"]},
                                     "json_schema": {"type": "object", "properties": {
                                         "name": {"type": "string"}, "schema": _SCHEMA_OBJECT,
                                         "strict": {"type": "boolean"}}}}}),
    "structured_outputs": FieldSpec("custom", "vLLM's constraint object: one of json, regex, choice, grammar, "
                                    "json_object, structural_tag", schema={"type": "object", "properties": {
                                        "json": {"anyOf": [_SCHEMA_OBJECT, {"type": "string"}]},
                                        "regex": {"type": "string"}, "choice": _STRINGS,
                                        "grammar": {"type": "string"}, "json_object": {"type": "boolean"},
                                        "structural_tag": {"type": "string"},
                                        "disable_any_whitespace": {"type": "boolean"}}}),
    "guided_json": FieldSpec("custom", "vLLM's older name for structured_outputs.json",
                             schema={"anyOf": [_SCHEMA_OBJECT, {"type": "string"}]}),
    "guided_regex": FieldSpec("custom", "vLLM's older name for structured_outputs.regex", schema={"type": "string"}),
    "guided_choice": FieldSpec("custom", "vLLM's older name for structured_outputs.choice", schema=_STRINGS),
    "guided_grammar": FieldSpec("custom", "vLLM's older name for structured_outputs.grammar (EBNF)",
                                schema={"type": "string"}),
}
COMPLETION_FIELDS: dict[str, FieldSpec] = {
    "prompt": FieldSpec("custom", "a string, strings, token ids, or lists of token ids", schema={"anyOf": [
        {"type": "string"}, {**_STRINGS, "minItems": 1, "maxItems": MAX_PROMPTS_PER_REQUEST},
        {**_TOKEN_IDS, "minItems": 1},
        {"type": "array", "items": {**_TOKEN_IDS, "minItems": 1}, "minItems": 1,
         "maxItems": MAX_PROMPTS_PER_REQUEST}]}),
    "echo": FieldSpec("boolean", "return the prompt before the completion (with its logprobs when asked)", False),
    "logprobs": FieldSpec("integer", "log-probabilities of each output token, with this many alternatives"),
    **COMMON_FIELDS, **SAMPLING_FIELDS, **STRUCTURED_FIELDS,
}
CHAT_FIELDS: dict[str, FieldSpec] = {
    "messages": FieldSpec("custom", "the conversation: role and content (text, and image_url parts for "
                                    "vision-language models) of each message", schema={
        "type": "array", "minItems": 1, "items": {"type": "object", "required": ["role"], "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
            "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"anyOf": [
                {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
                {"type": "object", "required": ["type", "image_url"],
                 "properties": {"type": {"const": "image_url"}, "image_url": {
                     "type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}}}]}}]}}}}),
    "logprobs": FieldSpec("boolean", "log-probability of each output token", False),
    "top_logprobs": FieldSpec("integer", "alternatives per output token (needs logprobs)", 0, schema={
        "type": "integer", **RANGES["logprobs"].json_schema()}),
    "max_completion_tokens": FieldSpec("integer", "most tokens to generate (OpenAI's newer name for max_tokens)"),
    "add_generation_prompt": FieldSpec("boolean", "end the prompt with the assistant's turn (vLLM's field)", True),
    "continue_final_message": FieldSpec("boolean", "leave the last assistant message open and continue it "
                                        "(needs add_generation_prompt: false)", False),
    "chat_template_kwargs": FieldSpec("custom", "extra variables for the chat template, e.g. {\"enable_thinking\": "
                                      "false} for Qwen3 (vLLM's field)", schema={"type": "object"}),
    "reasoning_effort": FieldSpec("custom", "none, minimal, low, medium, high or xhigh: handed to the chat template "
                                  "(as vLLM does; gpt-oss's template reads it)", schema={"enum": [
                                      "none", "minimal", "low", "medium", "high", "xhigh"]}),
    "mm_processor_kwargs": FieldSpec("custom", "settings for a vision-language model's processor for this "
                                     "request, e.g. {\"max_pixels\": 200704} (vLLM's field)", schema={"type": "object"}),
    "tools": FieldSpec("custom", "functions the model may call, for the chat template", schema={"type": "array"}),
    "tool_choice": FieldSpec("custom", "none, auto (needs --enable-auto-tool-choice), required or a named function",
                             schema={"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]}),
    "parallel_tool_calls": FieldSpec("boolean", "false: at most one tool call", True),
    **COMMON_FIELDS, **SAMPLING_FIELDS, **STRUCTURED_FIELDS,
}

EMBEDDING_FIELDS: dict[str, FieldSpec] = {
    "input": FieldSpec("custom", "text(s) or token ids to embed", schema=COMPLETION_FIELDS["prompt"].schema),
    "model": COMMON_FIELDS["model"],
    "encoding_format": FieldSpec("custom", "float or base64 (little-endian float32)", "float",
                                 schema={"enum": ["float", "base64"]}),
    "dimensions": FieldSpec("integer", "Matryoshka models only: the first N dimensions, normalized after the cut"),
    "normalize": FieldSpec("boolean", "decoder embedding models: L2-normalize (default: as the model's layout)"),
}
TOKENIZE_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "prompt": FieldSpec("string", "text to tokenize (or give messages)"),
    "messages": CHAT_FIELDS["messages"],
    "add_special_tokens": FieldSpec("boolean", "add the tokenizer's special tokens (prompt)", True),
    "add_generation_prompt": FieldSpec("boolean", "end with the assistant's turn (messages)", True),
    "chat_template_kwargs": CHAT_FIELDS["chat_template_kwargs"],
    "tools": CHAT_FIELDS["tools"],
}
DETOKENIZE_FIELDS: dict[str, FieldSpec] = {
    "model": COMMON_FIELDS["model"],
    "tokens": FieldSpec("custom", "token ids to turn into text", schema=_TOKEN_IDS),
}
REQUIRED_FIELDS = {"completions": ["prompt"], "chat": ["messages"], "embeddings": ["input"], "detokenize": ["tokens"]}


@dataclass
class SamplingRequest:
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: bool = False
    use_beam_search: bool = False
    length_penalty: float = 1.0
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage in every chunk
    prompt_logprobs_asked: bool = False  # the request's own prompt_logprobs (echo's are answered in logprobs)


def sampling_request(fields: Fields, *, chat: bool) -> SamplingRequest:
    """The sampling fields shared by /v1/completions and /v1/chat/completions."""
    refuse_unsupported(fields)
    max_tokens = fields.int("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = fields.int("max_tokens")
    logprobs, top_logprobs = _logprobs(fields, chat)
    stream = fields.bool("stream")
    options = fields.raw("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options")
    sampling = {name: fields.typed(name, spec) for name, spec in SAMPLING_FIELDS.items()}
    try:
        params = SamplingParams(**sampling, stop=stop_strings(fields),
                                stop_token_ids=int_list(fields, "stop_token_ids"),
                                max_tokens=max_tokens, logprobs=top_logprobs if logprobs else None,
                                logit_bias=logit_bias(fields), allowed_token_ids=int_list(fields, "allowed_token_ids")
                                or None, bad_words=string_list(fields, "bad_words") or None)
    except InvalidRequestError as exc:
        raise bad(str(exc), exc.param) from None
    include_usage, continuous_usage = _stream_options(options, stream)
    if stream and params.prompt_logprobs is not None:
        raise bad("prompt_logprobs are not available when stream is enabled (as in vLLM): leave out stream or "
                  "prompt_logprobs", "prompt_logprobs")
    length_penalty = fields.float("length_penalty")
    return SamplingRequest(params, stream, include_usage, echo=fields.bool("echo"),
                           use_beam_search=fields.bool("use_beam_search"),
                           length_penalty=1.0 if length_penalty is None else length_penalty,
                           continuous_usage=continuous_usage, prompt_logprobs_asked=params.prompt_logprobs is not None)


def _stream_options(options: dict[str, JSON] | None, stream: bool) -> tuple[bool, bool]:
    """include_usage and continuous_usage_stats; vLLM's rule: stream_options only with stream."""
    if not options:
        return False, False
    if not stream:
        raise bad("stream_options can only be set when stream is true", "stream_options")
    unknown = set(options) - {"include_usage", "continuous_usage_stats"}
    if unknown:
        raise bad(f"stream_options takes include_usage and continuous_usage_stats, not {', '.join(sorted(unknown))}",
                  "stream_options")
    return bool(options.get("include_usage")), bool(options.get("continuous_usage_stats"))


def completion_sampling_request(fields: Fields) -> SamplingRequest:
    """/v1/completions' sampling, with its defaults: 16 tokens when max_tokens is absent (OpenAI's
    default), and with echo, the prompt's log-probabilities as many as the completion's."""
    sampling = sampling_request(fields, chat=False)
    if fields.raw("max_tokens") is None:
        sampling.params.max_tokens = 16
        sampling.params.min_tokens = min(sampling.params.min_tokens, 16)
    if sampling.echo and sampling.params.logprobs is not None:
        sampling.params.prompt_logprobs = sampling.params.logprobs
    return sampling


def _logprobs(fields: Fields, chat: bool) -> tuple[bool, int]:
    if chat:  # chat: logprobs is a boolean, top_logprobs the number of alternatives
        wanted = fields.bool("logprobs")
        top = fields.int("top_logprobs", 0) or 0
        if not RANGES["logprobs"].contains(top):
            raise bad(f"top_logprobs must be {RANGES['logprobs'].describe()}, got {top}", "top_logprobs")
        if top and not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return wanted, top
    count = fields.int("logprobs")  # completions: logprobs is the number of alternatives (checked as such)
    if count is None:
        return False, 0
    return True, count


def completion_prompts(fields: Fields) -> list[str | list[int]]:
    return prompt_list(fields.raw("prompt"), "prompt")



def prompt_list(value: JSON, param: str) -> list[str | list[int]]:
    """OpenAI's prompt/input forms: a string, a list of strings, token ids, or a list of token-id lists."""
    prompts = _prompt_forms(value, param)
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        raise bad(f"{param} holds {len(prompts)} prompts; at most {MAX_PROMPTS_PER_REQUEST} per request: split the "
                  "batch", param)
    return prompts


def _prompt_forms(value: JSON, param: str) -> list[str | list[int]]:
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


def _is_token(value: JSON) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# apply_chat_template's own arguments: a template variable may not replace them
def model_permission(created: int) -> dict[str, Any]:
    """The `permission` entry vLLM's /v1/models gives every card (its ModelPermission defaults)."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}
