"""The tool-call parsers on vLLM's own parser-test vectors (tests/fixtures/vllm_parser_vectors, each with
the vLLM test it comes from): the calls (names, arguments, and ids where vLLM checks them) and content of
the whole text, and the same calls and content reassembled from streams in pieces of 1, 3 and 7
characters, as the openai SDK accumulates deltas. Where llmctl deliberately differs, the vector says why."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from helpers.paths import FIXTURES
from helpers.streamed_calls import streamed_calls
from llmctl.server.chat_message import StreamedMessage, ToolCalling, full_message
from llmctl.server.tool_parsers import ToolParserManager

VECTORS = json.loads((FIXTURES / "vllm_parser_vectors" / "tool_calls.json").read_text())["vectors"]


def calling_for(vector: dict) -> ToolCalling:
    def make():
        parser = ToolParserManager.get_tool_parser(vector["parser"])()
        parser.tools = vector["tools"] or []
        return parser

    return ToolCalling(make, True)


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: f"{v['parser']}-{v['case']}")
def test_vllms_vectors_whole_and_streamed(vector):
    calling = calling_for(vector)
    message, _ = full_message(vector["output"], "stop", calling)
    calls = message.get("tool_calls", [])
    assert [c["function"]["name"] for c in calls] == [expected[0] for expected in vector["calls"]]
    for call, (_, arguments, *call_id) in zip(calls, vector["calls"]):
        got = call["function"]["arguments"]
        assert (got if isinstance(arguments, str) else json.loads(got)) == arguments
        assert call_id in ([], [call["id"]])
    if vector.get("content_checked", True):
        assert message["content"] == vector["content"]
    whole = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    for step in (1, 3, 7):
        content, pieces, _ = streamed_calls(calling, vector["output"], step)
        if vector.get("stream_sends_the_broken_call"):  # sent before it could be known to be broken
            assert pieces and vector["output"].startswith(content), step
            continue
        assert (content or None, [(n, a) for _, n, a in pieces]) == (message["content"], [(n, a) for _, n, a in whole])
        native = [expected[2] for expected in vector["calls"] if len(expected) > 2]
        assert all(call_id in [i for i, _, _ in pieces] for call_id in native), step


def test_the_vectors_cover_each_new_parser():
    counts = Counter(vector["parser"] for vector in VECTORS)
    assert set(counts) == {"kimi_k2", "deepseek_v31", "glm45", "qwen3_coder", "seed_oss", "llama4_pythonic", "jamba",
                           "internlm", "granite", "granite-20b-fc", "phi4_mini_json", "xlam", "minimax_m2",
                           "hunyuan_a13b"} and \
        min(counts.values()) >= 4
    print("vLLM parser vectors:", dict(counts))


# each format's text, forced by a regex through `llmctl serve`, so the expected call is known (streams run the
# same StreamedMessage the vectors above stream through)
SERVED = {
    "qwen3_coder": "Checking.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "glm45": "Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "kimi_k2": "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0 "
               '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
    "deepseek_v31": "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
                    '{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]}}}


@pytest.mark.subprocess
def test_each_format_through_llmctl_serve(default_source):
    import re

    import openai

    from helpers.server_helpers import start_server

    for parser, text in SERVED.items():
        server = start_server("--max-model-len", "512", "--enable-auto-tool-choice", "--tool-call-parser", parser)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
            request = dict(model=client.models.list().data[0].id, max_tokens=300, tools=[WEATHER],
                           messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
                           extra_body={"structured_outputs": {"regex": re.escape(text)}})
            choice = client.chat.completions.create(**request).choices[0]
            [call] = choice.message.tool_calls
            assert (choice.message.content, choice.finish_reason) == ("Checking.", "tool_calls"), parser
            assert (call.function.name, json.loads(call.function.arguments)) == \
                ("get_weather", {"city": "Paris", "days": 3}), parser
            assert call.id == "functions.get_weather:0" if parser == "kimi_k2" else call.id.startswith("chatcmpl-tool-")
        finally:
            server.stop()


REASONING_VECTORS = json.loads((FIXTURES / "vllm_parser_vectors" / "reasoning.json").read_text())["vectors"]


@pytest.mark.parametrize("vector", REASONING_VECTORS, ids=lambda v: f"{v['parser']}-{v['case']}")
def test_vllms_reasoning_vectors_whole_and_streamed(vector):
    from llmctl.engine.reasoning import ReasoningParserManager

    parser_class = ReasoningParserManager.get_reasoning_parser(vector["parser"])

    def parser():
        return parser_class(template_kwargs=vector.get("template_kwargs"))

    message, _ = full_message(vector["output"], "stop", None, parser())
    assert (message["reasoning_content"], message["content"]) == (vector["reasoning"], vector["content"])
    for step in (1, 3, 7):
        streamed_message = StreamedMessage(None, parser())
        reasoning, content, text = "", "", vector["output"]
        for end in list(range(step, len(text), step)) + [len(text)]:
            delta = streamed_message.delta(text[:end], final=end == len(text))
            reasoning += delta.get("reasoning_content", "")
            content += delta.get("content", "")
        # a stream cannot say an empty reasoning apart from none
        expected = (vector["reasoning"] or None, vector["content"])
        assert (reasoning or None, content or None) == expected, step


def test_the_reasoning_vectors_cover_each_new_parser():
    counts = Counter(vector["parser"] for vector in REASONING_VECTORS)
    assert set(counts) == {"minimax_m2", "seed_oss", "mistral", "ernie45", "granite", "glm45", "deepseek_v3", "olmo3",
                           "hunyuan_a13b"} and min(counts.values()) >= 4
    print("vLLM reasoning vectors:", dict(counts))
