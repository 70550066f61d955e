"""The assistant message of a chat choice. With a reasoning parser the thinking goes to
`reasoning_content` (and vLLM's newer `reasoning`) and the rest is the answer. Without tool calling the
answer is the content; with a tool-call parser (tool_choice auto), or a forced tool choice (required, a
named function), it is read into content and OpenAI's `tool_calls`. A stream sends each choice's
message as deltas: new reasoning, new content, a call's index, id and name once its name is whole,
then its argument fragments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmctl.engine.front.outputs import RequestOutput
from llmctl.engine.reasoning import ReasoningFactory, ReasoningParser, ReasoningSplit
from llmctl.server.protocol import JSON
from llmctl.server.tool_parsers import ParsedText, ToolCallDraft, ToolParser
from llmctl.server.tool_parsers.json_scan import ScanMemo, incremental


@dataclass(frozen=True)
class ToolCalling:
    """How this request's output is read."""

    make_parser: Callable[[], ToolParser]  # a fresh parser per choice
    finish_as_tool_calls: bool  # finish_reason "tool_calls" once calls were made (auto, required; a named one: not)
    first_call_only: bool = False  # parallel_tool_calls: false

    def calls_of(self, parsed: ParsedText) -> list[ToolCallDraft]:
        return parsed.calls[:1] if self.first_call_only else parsed.calls


def tool_call(call_id: str, call: ToolCallDraft) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def finish_reason(reason: str | None, calling: ToolCalling | None, called: bool) -> str | None:
    """vLLM's: a choice that stopped after making calls finished with "tool_calls"."""
    if calling is not None and calling.finish_as_tool_calls and called and reason == "stop":
        return "tool_calls"
    return reason


def full_message(text: str, reason: str | None, calling: ToolCalling | None,
                 reasoning: ReasoningParser | None = None) -> tuple[dict[str, Any], str | None]:
    """The whole message and the choice's finish_reason."""
    message: dict[str, Any] = {"role": "assistant"}
    answer = text
    if reasoning is not None:  # vLLM's fields: reasoning_content, and its newer name reasoning
        split = reasoning.split(text, final=True)
        message["reasoning_content"] = message["reasoning"] = split.reasoning
        answer = split.content
    if calling is None:
        return message | {"content": answer if reasoning is None else answer or None}, reason
    parser = calling.make_parser()
    parsed = parser.extract(answer)
    if not parsed.calls:
        return message | {"content": parsed.content if reasoning is None else parsed.content or None}, reason
    calls = [tool_call(call.call_id or parser.new_call_id(), call) for call in calling.calls_of(parsed)]
    return message | {"content": parsed.content or None, "tool_calls": calls}, finish_reason(reason, calling, True)


def only_message(outputs: list[RequestOutput], calling: ToolCalling | None,
                 reasoning: ReasoningFactory | None) -> tuple[RequestOutput, dict[str, Any]]:
    """The one output of a single-choice request (/v1/responses, /v1/messages) and its whole message."""
    [output] = outputs
    completion = output.outputs[0]
    message, _ = full_message(completion.text, completion.finish_reason, calling, reasoning() if reasoning else None)
    return output, message


def each_part(delta: dict[str, JSON], reasoning: Callable[[str], list[str]], content: Callable[[str], list[str]],
              call: Callable[[dict[str, JSON]], list[str]]) -> list[str]:
    """A streamed message delta's events, in the order the model wrote its parts: thinking, answer, calls."""
    events = reasoning(delta["reasoning_content"]) if delta.get("reasoning_content") else []
    events += content(delta["content"]) if delta.get("content") else []
    for fragment in delta.get("tool_calls", []):
        events += call(fragment)
    return events


@dataclass
class _SentCall:
    call_id: str
    arguments_sent: int


@dataclass
class StreamedMessage:
    """One choice's message as sent so far; delta() returns what the grown text adds."""

    calling: ToolCalling | None
    reasoning: ReasoningParser | None = None
    parser: ToolParser | None = field(init=False)
    reasoning_sent: int = 0
    content_sent: int = 0
    calls: list[_SentCall] = field(default_factory=list)
    scan_memo: ScanMemo = field(default_factory=ScanMemo)

    def __post_init__(self) -> None:
        self.parser = self.calling.make_parser() if self.calling is not None else None

    @property
    def called(self) -> bool:
        return bool(self.calls)

    def delta(self, text: str, final: bool) -> dict[str, Any]:
        message: dict[str, Any] = {}
        split = self.reasoning.split(text, final) if self.reasoning is not None else ReasoningSplit(None, text)
        if split.reasoning is not None and len(split.reasoning) > self.reasoning_sent:
            message["reasoning_content"] = message["reasoning"] = split.reasoning[self.reasoning_sent:]
            self.reasoning_sent = len(split.reasoning)
        answer = split.content
        with incremental(self.scan_memo):  # the answer grows: JSON scans resume where they stopped
            parsed = self.parser.parse(answer, final) if self.parser is not None else ParsedText(answer)
        if final and not self.calls and not all(call.valid() for call in parsed.calls):
            parsed = ParsedText(answer)  # no call was whole: the text was an answer after all
        if len(parsed.content) > self.content_sent:
            message["content"] = parsed.content[self.content_sent:]
            self.content_sent = len(parsed.content)
        calls = self.calling.calls_of(parsed) if self.calling is not None else []
        fragments = [fragment for index, call in enumerate(calls)
                     if (fragment := self._call_fragment(index, call)) is not None]
        if fragments:
            message["tool_calls"] = fragments
        return message

    def _call_fragment(self, index: int, call: ToolCallDraft) -> dict[str, Any] | None:
        if index == len(self.calls):  # not announced yet: once its name is whole
            if call.name is None:
                return None
            assert self.parser is not None  # calls come from the parser
            self.calls.append(_SentCall(call.call_id or self.parser.new_call_id(), len(call.arguments)))
            return {"index": index, **tool_call(self.calls[index].call_id, call)}
        if index > len(self.calls):
            return None
        sent = self.calls[index]
        if len(call.arguments) <= sent.arguments_sent:
            return None
        fragment = call.arguments[sent.arguments_sent:]
        sent.arguments_sent = len(call.arguments)
        return {"index": index, "function": {"arguments": fragment}}
