"""/v1/chat/completions: messages rendered with the chat template, then generated like a completion."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from llmctl.checkpoint.tokenizer import resolve_chat_template
from llmctl.engine.front.engine_client import EngineClient
from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.reasoning import ReasoningFactory
from llmctl.engine.structured.params import StructuredOutputsParams
from llmctl.server.chat_message import StreamedMessage, ToolCalling, finish_reason
from llmctl.server.chat_request import chat_messages, chat_template_kwargs
from llmctl.server.content_parts import Message
from llmctl.server.generation import Endpoint, respond
from llmctl.server.harmony_prompt import harmony_prompt, harmony_stop_ids, harmony_text
from llmctl.server.images import check_images, with_images
from llmctl.server.models import check_model
from llmctl.server.protocol import (
    CHAT_FIELDS,
    JSON,
    Fields,
    SamplingRequest,
    bad,
    sampling_request,
    warn_ignored,
)
from llmctl.server.responses import Delta, Prompt, ResponseContext, chat_chunk, chat_response
from llmctl.server.state import ServerState
from llmctl.server.structured import structured_outputs
from llmctl.server.tools import ToolRequest, read_tools
from llmctl.server.transport import read_json


async def chat_completions(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    warn_ignored(fields, CHAT_FIELDS)
    chat = prepare_chat(state, fields)
    return await respond_to_chat(state, request, chat_endpoint(chat.calling, chat.reasoning(state)), model, chat)


async def respond_to_chat(state: ServerState, request: Request, endpoint: Endpoint, model: str,
                          chat: PreparedChat) -> Response:
    """Generate for a prepared chat; its images, if any, through the model's processor first."""
    processed = await with_images(state, chat.prompt[0] or "", chat.messages, chat.processor_kwargs)
    if processed is None:
        return await respond(state, request, endpoint, model, [chat.prompt], chat.sampling)
    return await respond(state, request, endpoint, model, [(processed.prompt, processed.token_ids)], chat.sampling,
                         [processed])


@dataclass(frozen=True)
class PreparedChat:
    sampling: SamplingRequest
    calling: ToolCalling | None
    prompt: Prompt
    messages: list[Message]  # as the chat template took them (image parts in transformers' form)
    processor_kwargs: dict[str, Any] | None = None  # vLLM's mm_processor_kwargs for the images
    thinking: bool = True  # False: enable_thinking false, or the prompt ends with </think> (vLLM's check)
    template_kwargs: dict[str, JSON] = field(default_factory=dict)  # the request's chat_template_kwargs

    def reasoning(self, state: ServerState) -> ReasoningFactory | None:
        """The server's --reasoning-parser for this chat's output, told whether its prompt turned thinking off
        and what the request asked of the template."""
        parser = state.reasoning_parser
        return partial(parser, thinking=self.thinking, template_kwargs=self.template_kwargs) if parser else None


def prepare_chat(state: ServerState, fields: Fields) -> PreparedChat:
    """A chat request's sampling (its structured output or forced tool choice included), how its output
    becomes tool calls, and its prompt through the chat template (shared with /v1/responses)."""
    sampling = sampling_request(fields, chat=True)
    tools = read_tools(fields, state.tool_parser, state.ready_engine.tokenizer)
    sampling.params.structured_outputs = _constraint(fields, state, tools)
    if state.harmony:
        _check_harmony_choice(tools)
        sampling.params.stop_token_ids = list(dict.fromkeys([*sampling.params.stop_token_ids, *harmony_stop_ids()]))
    reasoning = state.reasoning_parser
    if (tools.calling is not None and tools.calling.make_parser().keep_special_tokens) or \
            (reasoning is not None and reasoning.keep_special_tokens):
        sampling.params.skip_special_tokens = False  # the parsers' markers are special tokens
    continue_final = fields.bool("continue_final_message")
    add_generation_prompt = fields.bool("add_generation_prompt", True)
    if continue_final and add_generation_prompt:
        raise bad("continue_final_message and add_generation_prompt cannot both be true: pass "
                  "add_generation_prompt: false to continue the last assistant message", "continue_final_message")
    messages = chat_messages(fields)
    prompt = render_chat(state, fields, add_generation_prompt, continue_final, tools.tools, messages)
    template_kwargs = chat_template_kwargs(fields)
    thinking = template_kwargs.get("enable_thinking") is not False and not (prompt[0] or "").rstrip().endswith("</think>")
    return PreparedChat(sampling, tools.calling, prompt, messages, fields.raw("mm_processor_kwargs"), thinking,
                        template_kwargs)


def _constraint(fields: Fields, state: ServerState, tools: ToolRequest) -> StructuredOutputsParams | None:
    """The request's structured output, or the JSON schema a forced tool choice puts on it (not both)."""
    asked = structured_outputs(fields, state.structured_backend)
    if tools.schema is None:
        return asked
    if asked is not None:
        raise bad("tool_choice \"required\" or a named function already constrains the output to the tools' JSON: "
                  "drop response_format / structured_outputs, or use tool_choice \"auto\"", "tool_choice")
    return StructuredOutputsParams(json=tools.schema)


def _check_harmony_choice(tools: ToolRequest) -> None:
    if tools.schema is not None:
        raise bad("gpt-oss writes its calls in harmony's commentary channel, which a forced tool choice cannot "
                  "constrain: use tool_choice \"auto\" (with --tool-call-parser openai) or \"none\"", "tool_choice")


def render_chat(state: ServerState, fields: Fields, add_generation_prompt: bool = True,
                continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None,
                messages: list[Message] | None = None) -> tuple[str, list[int]]:
    """The request's messages through the chat template (with its chat_template_kwargs), and their ids;
    continue_final_message leaves the last (assistant) message open for the model to go on."""
    messages = messages if messages is not None else chat_messages(fields)
    check_images(state, messages)  # a text model's template cannot render image parts
    if continue_final_message and messages[-1]["role"] != "assistant":
        raise bad("continue_final_message needs the last message to be the assistant's", "continue_final_message")
    kwargs = chat_template_kwargs(fields)
    if state.harmony:
        if continue_final_message:
            raise bad("continue_final_message: gpt-oss chats are rendered in harmony, where the assistant always "
                      "starts a new message", "continue_final_message")
        ids = harmony_prompt(fields.raw("messages"), tools, kwargs, add_generation_prompt)
        return harmony_text(ids), ids
    if state.template is None:
        raise bad("this model has no chat template: start the server with --chat-template FILE or a built-in name "
                  "(chatml, bloom), or use /v1/completions", "messages")
    tokenizer = state.ready_engine.tokenizer
    text = tokenizer.apply_chat_template(messages, chat_template=state.template, tools=tools,
                                         add_generation_prompt=add_generation_prompt, tokenize=False,
                                         continue_final_message=continue_final_message, **kwargs)
    return text, tokenizer.encode(text, add_special_tokens=False)


def chat_template(given: str | None, engine: EngineClient) -> str | None:
    """--chat-template, else the model's own, else llmctl's for its family (e.g. BLOOM)."""
    if given is not None:
        return given
    own = getattr(engine.tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return own
    return resolve_chat_template(engine.source, engine.spec.model_type).text


class ChatStream:
    """Chat chunks: the assistant role for every choice first, as vLLM sends it, then content deltas (and,
    with tool calling, tool-call deltas)."""

    object_name = "chat.completion.chunk"

    def __init__(self, calling: ToolCalling | None = None, reasoning: ReasoningFactory | None = None) -> None:
        self.calling, self.reasoning = calling, reasoning
        self.messages: dict[int, StreamedMessage] = {}

    def opening(self, ctx: ResponseContext, num_choices: int) -> list[dict[str, Any]]:
        return [chat_chunk(ctx, choice, {"role": "assistant", "content": ""}) for choice in range(num_choices)]

    def before_output(self, ctx: ResponseContext, prompt_index: int, output: RequestOutput) -> list[dict[str, Any]]:
        return []

    def chunk(self, ctx: ResponseContext, prompt_index: int, delta: Delta) -> dict[str, Any] | None:
        if self.calling is None and self.reasoning is None:
            return chat_chunk(ctx, delta.choice, {"content": delta.text} if delta.text else {}, delta)
        if delta.choice not in self.messages:
            self.messages[delta.choice] = StreamedMessage(self.calling, self.reasoning() if self.reasoning else None)
        message = self.messages[delta.choice]
        end = delta.completion.finish_reason
        new = message.delta(delta.completion.text, final=end is not None)
        if not new and end is None and not delta.logprobs:
            return None  # text held back (a call's name not whole yet): nothing to send
        return chat_chunk(ctx, delta.choice, new, delta, finish_reason(end, self.calling, message.called))


def chat_endpoint(calling: ToolCalling | None, reasoning: ReasoningFactory | None = None) -> Endpoint:
    return Endpoint("chatcmpl-", partial(chat_response, calling=calling, reasoning=reasoning),
                    partial(ChatStream, calling, reasoning))
