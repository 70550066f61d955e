"""Tool calling through `llmctl serve` on the default model with the official openai client (and
LangChain): tool_choice "required" and a named function enforced with structured outputs, so every
call's arguments validate against its tool's schema (jsonschema); "auto" with vLLM's flags
(--enable-auto-tool-choice --tool-call-parser hermes), the model's text forced by a regex into the
Hermes format so the expected call is known; streamed tool-call deltas that reassemble to the same
calls; a --tool-parser-plugin; "none" with a tool history; and what is refused, by name."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from helpers.server_helpers import post

pytestmark = pytest.mark.subprocess

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "maxLength": 20},
                                                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                                                "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What's the weather in Paris for the next 3 days?"}]
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
HERMES_TEXT = ('Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>')
PLUGIN = '''
from llmctl.server.tool_parsers import ParsedText, ToolCallDraft, ToolParser, ToolParserManager



@ToolParserManager.register_module("call_line")
class CallLineParser(ToolParser):
    """CALL name {json}: read from the whole text only (no parse() of its own)."""

    def extract_tool_calls(self, text):
        if not text.startswith("CALL "):
            return ParsedText(text)
        name, _, arguments = text[len("CALL "):].partition(" ")
        return ParsedText("", [ToolCallDraft(name, arguments.strip(), True)])
'''


@pytest.fixture(scope="module")
def tool_client(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused"), tool_server


def check_calls(message, names=None):
    """Every call names a given tool and its arguments validate against that tool's schema."""
    assert message.tool_calls and message.content is None
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        assert call.function.name in (names or TOOLS)
        jsonschema.validate(json.loads(call.function.arguments), TOOLS[call.function.name]["function"]["parameters"])


def streamed(client, **request):
    """Content, calls [(id, name, arguments)] and finish reason, accumulated from the stream's deltas."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id and delta.function.name, "a call is announced with its id and name"
                calls[delta.index] = [delta.id, delta.function.name, ""]
            calls[delta.index][2] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [tuple(call) for _, call in sorted(calls.items())], finish


def test_required_makes_valid_calls_in_every_choice(tool_client):
    client, _ = tool_client
    # sampled, a 135M model may add calls until max_tokens: one call each (maxItems 1) keeps the answers whole
    sampled = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                             n=3, temperature=1.0, seed=7, max_tokens=120, parallel_tool_calls=False)
    greedy = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                            temperature=0, max_tokens=200)
    for choice in sampled.choices + greedy.choices:
        check_calls(choice.message)
        assert choice.finish_reason == "tool_calls"


def test_a_named_function_is_called_with_valid_arguments(tool_client):
    client, _ = tool_client
    for name in TOOLS:
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                                               tool_choice={"type": "function", "function": {"name": name}})
        check_calls(reply.choices[0].message, [name])
        assert len(reply.choices[0].message.tool_calls) == 1 and reply.choices[0].finish_reason == "stop"  # vLLM's


def test_streamed_calls_reassemble_to_the_same_calls(tool_client):
    client, _ = tool_client
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        request = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, temperature=0,
                       max_tokens=120)
        whole = client.chat.completions.create(**request).choices[0]
        content, calls, finish = streamed(client, **request)
        assert content == "" and finish == whole.finish_reason
        assert [(name, arguments) for _, name, arguments in calls] == \
            [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]


def test_auto_reads_hermes_calls_out_of_the_text(tool_client):
    client, _ = tool_client
    request = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=150,
                   extra_body={"structured_outputs": {"regex": re.escape(HERMES_TEXT)}})
    reply = client.chat.completions.create(**request).choices[0]
    assert reply.message.content == "Checking." and reply.finish_reason == "tool_calls"
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    content, calls, finish = streamed(client, **request)
    assert content == "Checking." and finish == "tool_calls"
    assert [(name, json.loads(arguments)) for _, name, arguments in calls] == [("get_weather", {"city": "Paris", "days": 3})]


def test_auto_answers_text_when_the_model_calls_nothing(tool_client):
    client, _ = tool_client
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=40,
                                           extra_body={"structured_outputs": {"regex": "It is sunny[.]"}})
    assert reply.choices[0].message.content == "It is sunny." and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


def test_parallel_tool_calls_false_allows_one_call(tool_client):
    client, _ = tool_client
    two = HERMES_TEXT + '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False,
                                           max_tokens=250, extra_body={"structured_outputs": {"regex": re.escape(two)}})
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["get_weather"]
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           parallel_tool_calls=False, n=4, temperature=1.0, seed=3, max_tokens=120)
    assert all(len(choice.message.tool_calls) == 1 for choice in reply.choices)


class Weather(BaseModel):
    city: str = Field(max_length=20)
    days: int = Field(ge=1, le=7)


def test_the_sdks_parse_with_a_pydantic_tool(tool_client):
    client, _ = tool_client
    reply = client.chat.completions.parse(model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
                                          tool_choice="required", max_tokens=120)
    assert isinstance(reply.choices[0].message.tool_calls[0].function.parsed_arguments, Weather)


def test_langchain_bind_tools(tool_client):
    """A client nobody here wrote: LangChain's bind_tools with a named tool choice."""
    from langchain_openai import ChatOpenAI

    _, server = tool_client
    chat = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=120)
    answer = chat.bind_tools([Weather], tool_choice="Weather").invoke(ASK[0]["content"])
    [call] = answer.tool_calls
    assert call["name"] == "Weather" and Weather(**call["args"])


@pytest.mark.parametrize("body,words", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "already constrains"),
    ({"tools": [WEATHER], "tool_choice": {"function": "get_weather"}}, "must be"),
    ({"tool_choice": "required"}, "needs tools"),
])
def test_tool_choices_that_cannot_be_answered_are_400s(tool_client, body, words):
    _, server = tool_client
    status, answer = post(server, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 2, **body})
    assert status == 400 and answer["error"]["param"] == "tool_choice" and words in answer["error"]["message"], answer


def test_a_tool_parser_plugin(default_source, tmp_path):
    from helpers.server_helpers import start_server

    plugin = tmp_path / "call_line.py"
    plugin.write_text(PLUGIN)
    server = start_server("--max-model-len", "1024", "--enable-auto-tool-choice", "--tool-parser-plugin", str(plugin),
                          "--tool-call-parser", "call_line")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        request = dict(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=60,
                       extra_body={"structured_outputs": {"regex": re.escape('CALL get_weather {"city": "Oslo"}')}})
        [call] = client.chat.completions.create(**request).choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})
        assert [(n, json.loads(a)) for _, n, a in streamed(client, **request)[1]] == [("get_weather", {"city": "Oslo"})]
    finally:
        server.stop()


def test_flags_that_do_not_fit_are_one_line(tmp_path):
    from helpers.cli_process import run_cli

    notes = tmp_path / "parser.txt"
    notes.write_text("not code")

    for flags, words in ((["--enable-auto-tool-choice"], "needs --tool-call-parser"),
                         (["--enable-auto-tool-choice", "--tool-call-parser", "nope"], "hermes, hunyuan_a13b, internlm, jamba, kimi_k2"),
                         (["--tool-parser-plugin", str(tmp_path / "missing.py")], "no such file"),
                         (["--tool-parser-plugin", str(notes)], "not a Python file")):
        result = run_cli("serve", "--port", "0", *flags)
        assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_tool_choice_none_answers_in_text_with_a_tool_history(server, client):
    reply = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


@pytest.mark.parametrize("body,param,words", [
    ({"tools": [WEATHER]}, "tool_choice", "--enable-auto-tool-choice"),  # auto, OpenAI's default with tools
    ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "--tool-call-parser"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}], "tool_choice": "none"}, "tools", "name"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f", "arguments": "{oops"}}]}]}, "messages", "arguments must be a JSON object"),
    ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
])
def test_auto_without_a_parser_and_malformed_tools_are_refused_by_name(server, body, param, words):
    status, answer = post(server, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert status == 400 and answer["error"]["param"] == param and words in answer["error"]["message"], answer


def test_unknown_fields_are_accepted_and_named_in_the_log(server):
    status, _ = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                      "frobnicate_level": 3, "parallel_tool_calls": True})
    assert status == 200
    status, _ = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "another_unknown": {}})
    assert status == 200
    assert "present in the request but ignored: frobnicate_level" in server.log
    assert "present in the request but ignored: another_unknown" in server.log
    assert "ignored: parallel_tool_calls" not in server.log
