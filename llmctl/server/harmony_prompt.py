"""A chat request as a harmony conversation, rendered to prompt ids by openai-harmony, as vLLM renders gpt-oss
chats: a system message (reasoning effort, today's date), a developer message holding the request's leading
system/developer text as instructions and its function tools, then the conversation — an assistant's earlier
answers on the final channel, its calls on commentary to functions.NAME (JSON), tool results from
functions.NAME. openai-harmony drops earlier turns' reasoning itself."""

from __future__ import annotations

import datetime
import json
import logging
from typing import TYPE_CHECKING

from llmctl.engine.front.engine_client import EngineClient
from llmctl.harmony.vocabulary import harmony_encoding, provide_vocabulary
from llmctl.server.content_parts import message_content
from llmctl.server.protocol import JSON, bad

if TYPE_CHECKING:
    from openai_harmony import Message

logger = logging.getLogger("llmctl.server")
EFFORTS = ("low", "medium", "high")  # the levels harmony's system message knows
TEMPLATE_KWARGS = ("reasoning_effort", "model_identity")  # what the harmony preamble takes (gpt-oss's template too)


def harmony_prompt(messages: list[dict[str, JSON]], tools: list[dict[str, JSON]] | None,
                   template_kwargs: dict[str, JSON], for_the_assistant: bool = True) -> list[int]:
    """The prompt ids of a chat (raw request messages, checked by chat_messages), opening the assistant's
    answer unless for_the_assistant is false (add_generation_prompt)."""
    from openai_harmony import Conversation, Role

    instructions, rest = _leading_instructions(messages)
    conversation = Conversation.from_messages(
        [_system_message(template_kwargs), _developer_message(instructions, tools), *_conversation(rest)])
    encoding = harmony_encoding()
    if for_the_assistant:
        return list(encoding.render_conversation_for_completion(conversation, Role.ASSISTANT))
    return list(encoding.render_conversation(conversation))


def _system_message(template_kwargs: dict[str, JSON]) -> Message:
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent

    unknown = sorted(set(template_kwargs) - set(TEMPLATE_KWARGS))
    if unknown:
        raise bad(f"chat_template_kwargs {', '.join(unknown)}: gpt-oss chats are rendered in harmony, which takes only "
                  f"{' and '.join(TEMPLATE_KWARGS)}", "chat_template_kwargs")
    content = SystemContent.new().with_conversation_start_date(datetime.date.today().isoformat())
    effort = template_kwargs.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad(f"reasoning_effort {effort!r}: gpt-oss's harmony format knows low, medium and high",
                      "reasoning_effort")
        content = content.with_reasoning_effort(ReasoningEffort(str(effort).capitalize()))
    identity = template_kwargs.get("model_identity")
    if identity is not None:
        if not isinstance(identity, str):
            raise bad("chat_template_kwargs.model_identity must be a string", "chat_template_kwargs")
        content = content.with_model_identity(identity)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(instructions: str | None, tools: list[dict[str, JSON]] | None) -> Message:
    from openai_harmony import DeveloperContent, Message, Role, ToolDescription

    content = DeveloperContent.new()
    if instructions is not None:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools([
            ToolDescription.new(tool["function"]["name"], tool["function"].get("description") or "",
                                parameters=tool["function"].get("parameters")) for tool in tools])
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _leading_instructions(messages: list[dict[str, JSON]]) -> tuple[str | None, list[dict[str, JSON]]]:
    """The text of the system/developer messages the chat opens with (vLLM: the developer's instructions)."""
    leading = 0
    while leading < len(messages) and messages[leading].get("role") in ("system", "developer"):
        leading += 1
    if leading == 0:
        return None, messages
    texts = [_text(message, f"messages[{index}]") for index, message in enumerate(messages[:leading])]
    return "\n\n".join(texts), messages[leading:]


def _conversation(messages: list[dict[str, JSON]]) -> list[Message]:
    from openai_harmony import Author, DeveloperContent, Message, Role

    result: list[Message] = []
    call_names: dict[str, str] = {}  # tool_call_id → function name, for the tool messages that answer them
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if role == "user":
            result.append(Message.from_role_and_content(Role.USER, _text(message, where)))
        elif role in ("system", "developer"):
            result.append(Message.from_role_and_content(
                Role.DEVELOPER, DeveloperContent.new().with_instructions(_text(message, where))))
        elif role == "assistant":
            result += _assistant(message, where, call_names)
        else:  # tool (chat_messages has checked the roles)
            name = _tool_name(message, where, call_names)
            result.append(Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"),
                                                          _text(message, where)).with_channel("commentary"))
    return result


def _assistant(message: dict[str, JSON], where: str, call_names: dict[str, str]) -> list[Message]:
    """An earlier assistant turn: its reasoning (analysis), its answer (final), its calls (commentary, JSON)."""
    from openai_harmony import Message, Role

    turn = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        turn.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    if message.get("content"):
        turn.append(Message.from_role_and_content(Role.ASSISTANT, _text(message, where)).with_channel("final"))
    for call in message.get("tool_calls") or []:  # chat_messages has checked their shape
        function = call["function"]
        if isinstance(call.get("id"), str):
            call_names[call["id"]] = function["name"]
        arguments = function.get("arguments", "{}")
        turn.append(Message.from_role_and_content(Role.ASSISTANT, arguments if isinstance(arguments, str) else
                                                  json.dumps(arguments))
                    .with_channel("commentary").with_recipient(f"functions.{function['name']}")
                    .with_content_type("json"))
    return turn


def _tool_name(message: dict[str, JSON], where: str, call_names: dict[str, str]) -> str:
    name = message.get("name") or call_names.get(str(message.get("tool_call_id")))
    if not isinstance(name, str):
        raise bad(f"{where}: a tool message needs the tool_call_id of an earlier assistant tool call (or a name): "
                  "harmony addresses tool results by function name", "messages")
    return name


def _text(message: dict[str, JSON], where: str) -> str:
    content = message_content(message.get("content"), where)
    if isinstance(content, str):
        return content
    if any(part.get("type") != "text" for part in content):
        raise bad(f"{where}: gpt-oss takes text only", "messages")
    return "".join(str(part.get("text", "")) for part in content)


def uses_harmony(engine: EngineClient) -> bool:
    """gpt-oss chats go through harmony (vLLM's rule: the model_type); its vocabulary is made ready now, from
    the model's tokenizer where it holds o200k (llmctl.harmony.vocabulary), so a failure shows at startup."""
    if engine.spec.model_type != "gpt_oss":
        return False
    folder = provide_vocabulary(engine.tokenizer)
    harmony_encoding()
    logger.info("chats in harmony (openai-harmony), its o200k_base vocabulary from %s",
                folder if folder is not None else "OpenAI's download")
    return True


def harmony_stop_ids() -> list[int]:
    """<|return|> and <|call|>: an assistant's turn ends at either (vLLM adds them to every harmony request)."""
    return list(harmony_encoding().stop_tokens_for_assistant_actions())


def harmony_text(ids: list[int]) -> str:
    return str(harmony_encoding().decode(ids))
