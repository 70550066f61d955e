"""The tool-call parsers on text in the formats their model families document (Qwen2.5's function-calling
guide for hermes, Meta's Llama 3.1/3.2 prompt formats, Mistral's [TOOL_CALLS] in both tokenizer
generations), the expected calls written out by hand or taken from vLLM's parser tests (named where used); and every answer streamed in pieces of 1, 3 and 7
characters reassembles (as the openai SDK accumulates deltas) to what the whole text gives."""

from __future__ import annotations

import json

import pytest

from helpers.streamed_calls import streamed_calls
from llmctl.server.chat_message import ToolCalling, full_message
from llmctl.server.tool_parsers import ToolParserManager
from llmctl.server.tool_parsers.forced import NamedToolCall, RequiredToolCalls, required_schema

QWEN = ('I will check both.\n<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
        '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date", "arguments": '
        '{"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"}}\n</tool_call>')
QWEN_CALLS = [("get_current_temperature", {"location": "San Francisco, CA, USA"}),
              ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01", "unit": "celsius"})]
CASES = {
    "hermes": [
        (QWEN, "I will check both.\n", QWEN_CALLS),
        ('<tool_call>\n{"arguments": {"q": "a \\"quoted\\" }{ brace"}, "name": "search"}\n</tool_call>', "",
         [("search", {"q": 'a "quoted" }{ brace'})]),  # the name after the arguments; braces inside strings
        ("No tools needed: <tool is a word here.", "No tools needed: <tool is a word here.", []),
    ],
    "llama3_json": [
        ('{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}',
         "", [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]),
        ('<|python_tag|>{"name": "a", "arguments": {"x": 1}}; {"name": "b", "parameters": {}}', "",
         [("a", {"x": 1}), ("b", {})]),
        ("The answer is {not a call}.", "The answer is {not a call}.", []),
    ],
    "mistral": [
        ('[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", "format": '
         '"celsius"}}, {"name": "get_time", "arguments": {"city": "Paris"}}]', "",
         [("get_current_weather", {"location": "Paris, France", "format": "celsius"}), ("get_time", {"city": "Paris"})]),
        ('Sure.[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris", "format": "celsius"}', "Sure.",
         [("get_current_weather", {"location": "Paris", "format": "celsius"})]),
        ("Plain [TOOL answer.", "Plain [TOOL answer.", []),
        # vLLM's vectors (tests/tool_parsers/test_mistral_tool_parser.py): v11's name{...} without [ARGS]
        ('[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}', "", [("add_this_and_that", {"a": 3.5, "b": 4})]),
        ('[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}', "",
         [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})]),
        ('hi{hi[TOOL_CALLS]bash{"command": "print(\\"hello world!\\")\\nre.compile(r\'{}\')"}', "hi{hi",
         [("bash", {"command": "print(\"hello world!\")\nre.compile(r'{}')"})]),
    ],
    "pythonic": [
        ("[get_user_info(user_id=7890, special='black')]", "",
         [("get_user_info", {"user_id": 7890, "special": "black"})]),
        ('<|python_start|>[a(x=[1, 2], y={"k": None}), b()]<|python_end|>', "",
         [("a", {"x": [1, 2], "y": {"k": None}}), ("b", {})]),
        ("[1, 2] is a list, not a call.", "[1, 2] is a list, not a call.", []),
    ],
}


def reassemble(calling: ToolCalling, text: str, step: int) -> tuple[str, list[tuple[str, str]], bool]:
    """Stream text in pieces of `step` characters; accumulate the deltas as the openai SDK does."""
    content, calls, called = streamed_calls(calling, text, step)
    return content, [(name, arguments) for _, name, arguments in calls], called


@pytest.mark.parametrize("name,text,content,calls", [(name, *case) for name, cases in CASES.items() for case in cases])
def test_parsers_read_their_families_formats(name, text, content, calls):
    calling = ToolCalling(lambda: ToolParserManager.get_tool_parser(name)(), True)
    message, finish = full_message(text, "stop", calling)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert got == calls
    assert message["content"] == (content or None if calls else content)
    assert finish == ("tool_calls" if calls else "stop")
    whole = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    for step in (1, 3, 7):
        assert reassemble(calling, text, step) == (content, whole, bool(calls)), step


def test_a_malformed_call_is_text_as_vllm_answers_but_a_stream_has_sent_it_as_written():
    text = '<tool_call>\n{"name": "broken", "arguments": {"a": }\n</tool_call>'
    calling = ToolCalling(lambda: ToolParserManager.get_tool_parser("hermes")(), True)
    assert full_message(text, "stop", calling) == ({"role": "assistant", "content": text}, "stop")
    assert reassemble(calling, text, 4) == ("", [("broken", '{"a": }')], True)  # sent before it could be known


def test_mistral_ids_are_nine_letters_and_digits_and_keep_the_special_marker():
    parser = ToolParserManager.get_tool_parser("mistral")()
    assert parser.keep_special_tokens and len(parser.new_call_id()) == 9 and parser.new_call_id().isalnum()


def test_parallel_tool_calls_false_keeps_the_first_call():
    calling = ToolCalling(lambda: ToolParserManager.get_tool_parser("hermes")(), True, first_call_only=True)
    message, _ = full_message(QWEN, "stop", calling)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_current_temperature"]
    assert [name for name, _ in reassemble(calling, QWEN, 5)[1]] == ["get_current_temperature"]


def test_forced_choices_read_the_json_the_schema_allows():
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    message, finish = full_message(text, "stop", ToolCalling(RequiredToolCalls, True))
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [("f", {"a": 1}), ("g", {})] and finish == "tool_calls" and message["content"] is None
    named = ToolCalling(lambda: NamedToolCall("f"), False)
    message, finish = full_message(' {"a": [1, 2]}\n', "stop", named)
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": [1, 2]}'} and finish == "stop"
    assert reassemble(named, ' {"a": [1, 2]}\n', 2)[1] == [("f", '{"a": [1, 2]}')]
    cut, finish = full_message('[{"name": "f", "parameters": {"a"', "length", ToolCalling(RequiredToolCalls, True))
    assert cut == {"role": "assistant", "content": '[{"name": "f", "parameters": {"a"'} and finish == "length"


def test_the_required_schema_is_vllms():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "g"}}]
    schema = required_schema(tools, parallel_tool_calls=False)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [option["properties"]["name"]["enum"] for option in schema["items"]["anyOf"]] == [["f"], ["g"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    assert schema["$defs"] == {"P": {"type": "integer"}}
    assert "maxItems" not in required_schema(tools, parallel_tool_calls=True)


def test_unknown_parser_names_the_known_ones():
    from llmctl.errors import LlmctlError

    with pytest.raises(LlmctlError, match="glm45, glm4_moe, granite, granite-20b-fc, hermes, hunyuan_a13b, internlm, jamba, kimi_k2, llama3_json, "
                       "llama4_json, llama4_pythonic, minimax_m2, mistral, openai, phi4_mini_json"):
        ToolParserManager.get_tool_parser("nope")


def test_a_long_streamed_call_is_scanned_once_not_from_its_start_at_every_delta():
    """The JSON scanner resumes where the last delta's scan stopped: the Python lines it runs over a call
    streamed one character at a time grow with the call's length, not with its square (counted, not timed:
    ~120 lines per delta here; re-reading from the start would run ~n²/2 lines, ~40 million for this call),
    and the streamed call is the whole one."""
    import sys
    from pathlib import Path

    import llmctl.server.tool_parsers.json_scan as json_scan

    content = 'print("a \\"quoted\\" line")\n' * 150  # ~4 KB of escapes, quotes and brackets in one argument
    call = {"name": "write_file", "arguments": {"path": "a.py", "content": content, "modes": [[1, 2], {"x": [3]}]}}
    text = "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"
    scanner_file, lines = str(Path(json_scan.__file__)), 0

    def count(frame, event, arg):
        nonlocal lines
        if frame.f_code.co_filename == scanner_file:
            lines += event == "line"
            return count
        return None

    calling = ToolCalling(lambda: ToolParserManager.get_tool_parser("hermes")(), True)
    sys.settrace(count)
    try:
        _, pieces, _ = streamed_calls(calling, text, 1)
    finally:
        sys.settrace(None)
    assert [(name, json.loads(arguments)) for _, name, arguments in pieces] == [("write_file", call["arguments"])]
    assert lines < 200 * len(text), f"{lines} scanner lines for {len(text)} characters"
    print(f"scanner lines for a {len(text)}-character call streamed in 1-character deltas: {lines}")
