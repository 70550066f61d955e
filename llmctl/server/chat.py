"""/v1/chat/completions: messages rendered with the chat template, then generated like a completion."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from llmctl.checkpoint.tokenizer import resolve_chat_template
from llmctl.engine.front.engine_client import EngineClient
from llmctl.engine.front.outputs import RequestOutput
from llmctl.server.generation import Endpoint, respond
from llmctl.server.models import check_model
from llmctl.server.protocol import Fields, bad, chat_messages, chat_template_kwargs, sampling_request
from llmctl.server.responses import Delta, ResponseContext, chat_chunk, chat_response
from llmctl.server.state import ServerState
from llmctl.server.structured import structured_outputs
from llmctl.server.tools import chat_tools
from llmctl.server.transport import read_json


async def chat_completions(state: ServerState, request: Request) -> Response:
    fields = await read_json(request)
    model = check_model(state, fields)
    sampling = sampling_request(fields, chat=True)
    sampling.params.structured_outputs = structured_outputs(fields, state.structured_backend)
    continue_final = fields.bool("continue_final_message")
    add_generation_prompt = fields.bool("add_generation_prompt", True)
    if continue_final and add_generation_prompt:
        raise bad("continue_final_message and add_generation_prompt cannot both be true: pass "
                  "add_generation_prompt: false to continue the last assistant message", "continue_final_message")
    text, ids = render_chat(state, fields, add_generation_prompt, continue_final)
    return await respond(state, request, CHAT, model, [(text, ids)], sampling)


def render_chat(state: ServerState, fields: Fields, add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> tuple[str, list[int]]:
    """The request's messages through the chat template (with its chat_template_kwargs), and their ids;
    continue_final_message leaves the last (assistant) message open for the model to go on."""
    messages = chat_messages(fields)
    if continue_final_message and messages[-1]["role"] != "assistant":
        raise bad("continue_final_message needs the last message to be the assistant's", "continue_final_message")
    kwargs = chat_template_kwargs(fields)
    if state.template is None:
        raise bad("this model has no chat template: start the server with --chat-template FILE or a built-in name "
                  "(chatml, bloom), or use /v1/completions", "messages")
    tokenizer = state.ready_engine.tokenizer
    text = tokenizer.apply_chat_template(messages, chat_template=state.template, tools=chat_tools(fields),
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
    """Chat chunks: the assistant role for every choice first, as vLLM sends it, then content deltas."""

    object_name = "chat.completion.chunk"

    def opening(self, ctx: ResponseContext, num_choices: int) -> list[dict]:
        return [chat_chunk(ctx, choice, {"role": "assistant", "content": ""}) for choice in range(num_choices)]

    def before_output(self, ctx: ResponseContext, prompt_index: int, output: RequestOutput) -> list[dict]:
        return []

    def chunk(self, ctx: ResponseContext, prompt_index: int, delta: Delta) -> dict:
        return chat_chunk(ctx, delta.choice, {"content": delta.text} if delta.text else {}, delta)


CHAT = Endpoint("chatcmpl-", chat_response, ChatStream)
