"""/v1/messages (Anthropic's Messages API) through `llmctl serve` with the official `anthropic` SDK,
unchanged: text equal to the greedy chat completion the request means (system, a multi-turn history),
usage in Anthropic's terms, stop_sequences with stop_reason "stop_sequence", streaming events the SDK's
own accumulator rebuilds into the same message, tools (auto through the hermes parser with the text
forced by a regex, so the expected call is known; "any" and a named tool enforced by structured
outputs), a tool_use / tool_result round trip equal to the chat history it means, count_tokens equal
to the chat prompt's length, and errors in Anthropic's shape that the SDK raises as
its own exception classes."""

from __future__ import annotations

import json
import re

import anthropic
import jsonschema
import openai
import pytest

from helpers.server_helpers import post

pytestmark = pytest.mark.subprocess

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GREEDY = {"temperature": 0}  # the 2026 SDK has no sampling arguments: vLLM's fields go in the body
WEATHER = {"name": "get_weather", "description": "Weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                            "required": ["city", "days"]}}
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": WEATHER["input_schema"]}}
ASK = [{"role": "user", "content": "What's the weather in Paris for the next 3 days?"}]
HERMES_TEXT = ('Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
               '</tool_call>')


@pytest.fixture(scope="module")
def served(tool_server):
    return (anthropic.Anthropic(base_url=tool_server.url, api_key="unused"),
            openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused"), tool_server)


def test_text_is_the_chat_completion_it_means(served):
    claude, chat, _ = served
    history = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
               {"role": "user", "content": [{"type": "text", "text": "Another one?"}]}]
    for max_tokens in (4, 40):
        reply = claude.messages.create(model=MODEL, max_tokens=max_tokens, system="Answer in one word.",
                                       messages=history, extra_body=GREEDY)
        expected = chat.chat.completions.create(
            model=MODEL, max_tokens=max_tokens, temperature=0,
            messages=[{"role": "system", "content": "Answer in one word."}, *history[:2],
                      {"role": "user", "content": "Another one?"}])
        [block] = reply.content
        assert block.type == "text" and block.text == expected.choices[0].message.content
        assert reply.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[expected.choices[0].finish_reason]
        assert reply.id.startswith("msg_") and reply.role == "assistant" and reply.model == MODEL
        assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == expected.usage.prompt_tokens
        assert reply.usage.output_tokens == expected.usage.completion_tokens
    assert reply.usage.cache_read_input_tokens > 0  # the second request read the shared system prefix from cache


def test_a_stop_sequence_ends_the_turn_and_is_named(served):
    claude, _, _ = served
    ask = [{"role": "user", "content": "Tell me about the sea."}]
    whole = claude.messages.create(model=MODEL, max_tokens=30, messages=ask, extra_body=GREEDY).content[0].text
    word = whole.split()[3]
    reply = claude.messages.create(model=MODEL, max_tokens=30, messages=ask, stop_sequences=[word], extra_body=GREEDY)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == word
    assert reply.content[0].text == whole[:whole.index(word)]


def test_streamed_events_rebuild_the_same_message(served):
    claude, _, _ = served
    request = dict(model=MODEL, max_tokens=25, messages=[{"role": "user", "content": "Say hello."}], extra_body=GREEDY)
    whole = claude.messages.create(**request)
    with claude.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()  # the SDK's accumulator checks indices and order
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    raw = [event.type for event in claude.messages.create(stream=True, **request)]
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(raw[2:-3]) == {"content_block_delta"}


def test_auto_tool_calls_become_tool_use_blocks_whole_and_streamed(served):
    claude, _, _ = served
    request = dict(model=MODEL, max_tokens=150, messages=ASK, tools=[WEATHER],
                   extra_body={**GREEDY, "structured_outputs": {"regex": re.escape(HERMES_TEXT)}})
    reply = claude.messages.create(**request)
    assert [block.type for block in reply.content] == ["text", "tool_use"] and reply.stop_reason == "tool_use"
    assert reply.content[0].text == "Checking."
    call = reply.content[1]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris", "days": 3}) and call.id
    with claude.messages.stream(**request) as stream:
        final = stream.get_final_message()  # input_json_delta fragments, parsed by the SDK
    assert [(b.type, getattr(b, "text", None), getattr(b, "input", None)) for b in final.content] == \
        [("text", "Checking.", None), ("tool_use", None, {"city": "Paris", "days": 3})]
    assert final.stop_reason == "tool_use"


def test_any_and_a_named_tool_are_enforced(served):
    claude, _, _ = served
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        reply = claude.messages.create(model=MODEL, max_tokens=120, messages=ASK, tools=[WEATHER], tool_choice=choice,
                                       extra_body=GREEDY)
        calls = [block for block in reply.content if block.type == "tool_use"]
        assert calls and reply.stop_reason == "tool_use"
        for call in calls:
            assert call.name == "get_weather"
            jsonschema.validate(call.input, WEATHER["input_schema"])
    single = claude.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER],
                                    tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert [block.type for block in single.content] == ["tool_use"]


def test_a_tool_result_round_trip_is_the_chat_history_it_means(served):
    claude, chat, _ = served
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 3}}
    history = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, call]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [{"type": "text", "text": "18 C, sunny"}]}]}]
    reply = claude.messages.create(model=MODEL, max_tokens=30, messages=history, tools=[WEATHER],
                                   tool_choice={"type": "none"}, extra_body=GREEDY)
    expected = chat.chat.completions.create(model=MODEL, max_tokens=30, temperature=0, tools=[CHAT_WEATHER],
                                            tool_choice="none", messages=[
        *ASK, {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(
                call["input"])}}]}, {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"}])
    assert reply.content[0].text == expected.choices[0].message.content
    assert claude.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER]).input_tokens == \
        expected.usage.prompt_tokens


def test_count_tokens_is_the_prompts_length(served):
    claude, chat, _ = served
    messages = [{"role": "user", "content": "Name a colour."}]
    expected = chat.chat.completions.create(model=MODEL, max_tokens=1, messages=[
        {"role": "system", "content": "Be brief."}, *messages]).usage.prompt_tokens
    assert claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages).input_tokens == expected
    # Claude Code's per-request attribution block is dropped, as vLLM drops it, so the prefix stays cacheable
    billed = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=ab12;"},
              {"type": "text", "text": "Be brief."}]
    assert claude.messages.count_tokens(model=MODEL, system=billed, messages=messages).input_tokens == expected


def test_errors_are_anthropics_and_the_sdk_raises_its_own(served):
    claude, _, server = served
    ask = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        claude.messages.create(model="claude-nope", max_tokens=5, messages=ask)
    with pytest.raises(anthropic.BadRequestError, match="document"):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="server tools"):
        claude.messages.create(model=MODEL, max_tokens=5, messages=ask,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    status, body = post(server, "/v1/messages", {"model": MODEL, "messages": ask})
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    status, body = post(server, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": ask,
                                                 "thinking": {"type": "enabled", "budget_tokens": 10}})
    assert status == 400 and "budget_tokens" in body["error"]["message"]
    status, body = post(server, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": ask,
                                                 "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]})
    assert status == 400 and "mcp_servers" in body["error"]["message"]
