"""gpt-oss's harmony format through `llmctl serve` (issue 65): a tiny random gpt-oss with gpt-oss's own
tokenizer (o200k_harmony, built from OpenAI's o200k_base by transformers' converter). Prompts equal
openai-harmony's rendering of the same conversation, built here with openai-harmony's own API; outputs forced
by a Lark grammar naming harmony's special tokens (llguidance) come back through the official openai and
anthropic clients as reasoning, tool calls and the final answer — in chat (whole and streamed), /v1/responses
and /v1/messages. The server finds the o200k vocabulary in the model's tokenizer (no download, no variable)."""

from __future__ import annotations

import datetime
import json

import openai
import pytest

from helpers.harmony_model import o200k_vocabulary, reference_encoding, save_gpt_oss
from helpers.server_helpers import post, start_server

pytestmark = pytest.mark.subprocess

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Paris?"}]
CALL = ('start: <|channel|> "analysis" <|message|> "I need the weather." <|end|> <|start|> "assistant" <|channel|> '
        '"commentary to=functions.get_weather " <|constrain|> "json" <|message|> "{\\"city\\": \\"Paris\\"}" <|call|>')
FINAL = ('start: <|channel|> "analysis" <|message|> "Easy." <|end|> <|start|> "assistant" <|channel|> "final" '
         '<|message|> "Sunny, 21 C." <|return|>')


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_gpt_oss(tmp_path_factory.mktemp("gpt_oss") / "gpt_oss")


@pytest.fixture(scope="module")
def server(folder):
    running = start_server(str(folder), "--max-model-len", "512", "--dtype", "float32", "--enable-auto-tool-choice",
                           "--tool-call-parser", "openai", timeout=240, unset=("TIKTOKEN_ENCODINGS_BASE",))
    running.model = str(folder)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def expected_prompt(effort: str, day: str) -> list[int]:
    """The conversation of test_prompts_are_openai_harmonys_rendering, built with openai-harmony's own API."""
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
    )

    tool = TOOLS[0]["function"]
    messages = [
        Message.from_role_and_content(Role.SYSTEM, SystemContent.new().with_reasoning_effort(ReasoningEffort(effort))
                                      .with_conversation_start_date(day)),
        Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new().with_instructions("Answer briefly.")
                                      .with_function_tools([ToolDescription.new(tool["name"], tool["description"],
                                                                                parameters=tool["parameters"])])),
        Message.from_role_and_content(Role.USER, "Weather in Paris?"),
        Message.from_role_and_content(Role.ASSISTANT, '{"city": "Paris"}').with_channel("commentary")
        .with_recipient("functions.get_weather").with_content_type("json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.get_weather"), "sunny")
        .with_channel("commentary"),
        Message.from_role_and_content(Role.ASSISTANT, "Sunny.").with_channel("final"),
        Message.from_role_and_content(Role.USER, "And tomorrow?"),
    ]
    return list(reference_encoding().render_conversation_for_completion(Conversation.from_messages(messages),
                                                                         Role.ASSISTANT))


def test_prompts_are_openai_harmonys_rendering(server, client):
    conversation = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},  # named by its call, as OpenAI's clients send it
        {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And tomorrow?"}]
    days = {datetime.date.today().isoformat()}
    status, body = post(server, "/tokenize", {"model": server.model, "messages": conversation, "tools": TOOLS,
                                              "reasoning_effort": "high"})
    days.add(datetime.date.today().isoformat())  # the system message dates the conversation, as vLLM's does
    assert status == 200
    assert body["tokens"] in [expected_prompt("High", day) for day in days]
    reply = client.chat.completions.create(model=server.model, messages=conversation, tools=TOOLS, max_tokens=1,
                                           reasoning_effort="high")
    assert reply.usage.prompt_tokens == len(body["tokens"])
    assert "o200k_base vocabulary from" in server.log and "tiktoken" in server.log  # made from the model's tokenizer


def forced(grammar: str) -> dict:
    return {"structured_outputs": {"grammar": grammar}}


def test_a_call_comes_back_as_reasoning_and_a_tool_call(server, client):
    request = dict(model=server.model, messages=ASK, tools=TOOLS, max_tokens=60, extra_body=forced(CALL))
    choice = client.chat.completions.create(**request).choices[0]
    message = choice.message.model_dump()
    assert choice.finish_reason == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] == message["reasoning"] == "I need the weather."
    [call] = message["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    reasoning, arguments, names, finish = "", "", [], None
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta.model_dump()
        reasoning += delta.get("reasoning_content") or ""
        assert not delta.get("content")
        for fragment in delta.get("tool_calls") or []:
            names += [fragment["function"]["name"]] if fragment["function"].get("name") else []
            arguments += fragment["function"].get("arguments") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, names, json.loads(arguments), finish) == \
        ("I need the weather.", ["get_weather"], {"city": "Paris"}, "tool_calls")


def test_a_final_answer_comes_back_as_reasoning_and_content(server, client):
    request = dict(model=server.model, messages=ASK, max_tokens=60, extra_body=forced(FINAL))
    choice = client.chat.completions.create(**request).choices[0]
    assert (choice.message.model_dump()["reasoning"], choice.message.content, choice.finish_reason) == \
        ("Easy.", "Sunny, 21 C.", "stop")
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta.model_dump()
        reasoning, content = reasoning + (delta.get("reasoning_content") or ""), content + (delta.get("content") or "")
    assert (reasoning, content) == ("Easy.", "Sunny, 21 C.")


def test_responses_and_messages_carry_reasoning_and_calls(server, client):
    tool = {"type": "function", **TOOLS[0]["function"]}
    called = client.responses.create(model=server.model, input="Weather in Paris?", instructions="Answer briefly.",
                                     tools=[tool], max_output_tokens=60, extra_body=forced(CALL))
    assert [item.type for item in called.output] == ["reasoning", "function_call"]
    assert called.output[0].content[0].text == "I need the weather."
    assert (called.output[1].name, json.loads(called.output[1].arguments)) == ("get_weather", {"city": "Paris"})
    answered = client.responses.create(model=server.model, input="Weather in Paris?", max_output_tokens=60,
                                       extra_body=forced(FINAL))
    assert [item.type for item in answered.output] == ["reasoning", "message"] and answered.output_text == "Sunny, 21 C."
    with client.responses.stream(model=server.model, input="Weather in Paris?", tools=[tool], max_output_tokens=60,
                                 extra_body=forced(CALL)) as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["reasoning", "function_call"]

    import anthropic

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused")
    reply = claude.messages.create(model=server.model, max_tokens=60, messages=[ASK[1]], extra_body=forced(CALL),
                                   tools=[{"name": "get_weather", "description": "The weather in a city",
                                           "input_schema": TOOLS[0]["function"]["parameters"]}])
    assert [block.type for block in reply.content] == ["thinking", "tool_use"] and reply.stop_reason == "tool_use"
    assert reply.content[1].input == {"city": "Paris"}


@pytest.mark.parametrize("body,field", [
    ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
    ({"reasoning_effort": "minimal"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"enable_thinking": True}}, "chat_template_kwargs"),
    ({"messages": [{"role": "tool", "content": "sunny"}]}, "messages"),
    ({"continue_final_message": True, "add_generation_prompt": False,
      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]}, "continue_final_message"),
])
def test_what_harmony_cannot_render_is_a_400_that_says_so(server, body, field):
    status, answer = post(server, "/v1/chat/completions", {"model": server.model, "messages": ASK, "max_tokens": 1,
                                                           **body})
    assert status == 400 and answer["error"]["param"] == field, answer


def test_the_vocabulary_is_o200k_base_from_gpt_oss_tokenizer_and_nothing_else(folder, tokenizer):
    """llmctl's own o200k_base from a gpt-oss tokenizer is OpenAI's file byte for byte; another tokenizer
    (the default model's) gives none."""
    from tokenizers import Tokenizer

    from llmctl.harmony.vocabulary import o200k_from_vocab

    made = o200k_from_vocab(Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab())
    assert made == o200k_vocabulary().read_bytes()
    assert o200k_from_vocab(tokenizer.get_vocab()) is None


SPLITS = [  # harmony text (markers as the detokenizer keeps them) → reasoning, content, calls
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
     "Think.", "Done.", []),
    ("<|channel|>analysis<|message|>A.<|end|><|start|>assistant<|channel|>analysis<|message|>B.<|end|>"
     "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"  # a preamble: content
     "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}",
     "A.\nB.", "Checking.", [("get_weather", {"city": "Oslo"})]),
    ("<|channel|>analysis<|message|>cut off while thinking", "cut off while thinking", "", []),
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>fin", "Think.", "", []),  # cut in a header
    ("no harmony at all", None, "no harmony at all", []),  # a model that strays: its text is kept as the answer
]


@pytest.mark.parametrize("text,reasoning,content,calls", SPLITS)
def test_harmony_output_splits_the_same_whole_and_streamed(monkeypatch, text, reasoning, content, calls):
    """The openai_gptoss reasoning parser with the openai tool parser, on the whole text and on its pieces as a
    stream sends them (1, 3 and 7 characters at a time): the same reasoning, content and calls."""
    from llmctl.engine.reasoning import ReasoningParserManager
    from llmctl.harmony import vocabulary
    from llmctl.server.chat_message import StreamedMessage, ToolCalling, full_message
    from llmctl.server.tool_parsers import ToolParserManager

    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(o200k_vocabulary().parent))
    vocabulary.harmony_encoding.cache_clear()
    parser = ReasoningParserManager.get_reasoning_parser("openai_gptoss")
    calling = ToolCalling(ToolParserManager.get_tool_parser("openai"), True)
    message, _ = full_message(text, "stop", calling, parser())
    assert (message.get("reasoning"), message["content"] or "") == (reasoning, content)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])] \
        == calls
    for step in (1, 3, 7):
        stream, got = StreamedMessage(calling, parser()), {"reasoning_content": "", "content": ""}
        arguments = ""
        for end in [*range(step, len(text), step), len(text)]:
            delta = stream.delta(text[:end], final=end == len(text))
            for key in got:
                got[key] += delta.get(key, "")
            arguments += "".join(f["function"].get("arguments", "") for f in delta.get("tool_calls", []))
        assert (got["reasoning_content"] or None, got["content"]) == (reasoning, content), step
        assert ([json.loads(arguments)] if arguments else []) == [args for _, args in calls], step


def test_with_the_reasoning_parser_a_grammar_waits_for_the_final_channel(folder):
    """--reasoning-parser openai_gptoss: the engine's markers are harmony's (a prompt ending in <|start|>assistant
    has not ended the reasoning), so the grammar holds only from <|channel|>final<|message|> on."""
    from transformers import AutoTokenizer

    from llmctl.engine.front.llm_engine import reasoning_marker_ids
    from llmctl.engine.structured.manager import StructuredOutputManager
    from llmctl.engine.structured.params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    end, start = reasoning_marker_ids("openai_gptoss", tokenizer)
    manager = StructuredOutputManager(tokenizer, len(tokenizer), [200002, 200012], reasoning_end_ids=end,
                                      reasoning_start_ids=start)
    prompt = expected_prompt("Low", "2026-01-01")
    gate = manager.matcher(StructuredOutputsParams(choice=("yes", "no")), prompt)
    analysis = tokenizer.encode("<|channel|>analysis<|message|>maybe<|end|><|start|>assistant", add_special_tokens=False)
    assert all(gate.accept(token) for token in analysis)  # thinking: anything
    maybe, yes = (tokenizer.encode(word, add_special_tokens=False)[0] for word in ("maybe", "yes"))
    assert all(gate.accept(token) for token in end)
    assert not gate.accept(maybe) and gate.accept(yes)  # the final channel: the grammar's


def test_inspect_says_the_chat_is_harmony(folder):
    from helpers.cli_process import run_cli

    result = run_cli("inspect", str(folder))
    assert result.returncode == 0, result.stderr
    assert "harmony, rendered and parsed by openai-harmony" in " ".join(result.stdout.split())
