"""Tool fields of chat requests, as far as llmctl answers them today: tool_choice "none" (the tools go to
the chat template, the answer is text), a history with assistant tool_calls and tool results, and the
choices that need what llmctl does not have yet refused by name (auto: a tool-call parser, as vLLM says)."""

from __future__ import annotations

import pytest

from test_server import post

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]


def test_tool_choice_none_answers_in_text_with_a_tool_history(server, client):
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(model=model, messages=HISTORY, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("body,param,words", [
    ({"tools": [WEATHER]}, "tool_choice", "--enable-auto-tool-choice"),  # auto, OpenAI's default with tools
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "--tool-call-parser"),
    ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice", "not supported yet"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}], "tool_choice": "none"}, "tools", "name"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{oops"}}]}]}, "messages", "arguments must be a JSON object"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
])
def test_what_is_not_answered_yet_is_refused_by_name(server, body, param, words):
    status, answer = post(server, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert status == 400 and answer["error"]["param"] == param and words in answer["error"]["message"], answer
