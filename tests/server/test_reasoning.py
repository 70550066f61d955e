"""Reasoning models (issue 35): `--reasoning-parser deepseek_r1 | qwen3` split the thinking into
`reasoning_content` (and vLLM's `reasoning`), streamed the same way; structured outputs constrain the
answer only. Served: a random-weight Llama with the default model's tokenizer plus Qwen3's <think>
tokens and a Qwen3-style chat template (enable_thinking: false puts an empty think block in the prompt),
through the official openai client."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
import torch

from helpers.models import save_random_model
from helpers.server_helpers import post

pytestmark = pytest.mark.subprocess

TEMPLATE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
            "{%- if add_generation_prompt %}<|im_start|>assistant\n"
            "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
            "{%- endif %}"
            "{%- endif %}")
ASK = [{"role": "user", "content": "Say hello."}]
SCHEMA = {"type": "object", "properties": {"greeting": {"type": "string", "maxLength": 12}}, "required": ["greeting"]}
CASES = {  # text → (reasoning, content), as vLLM's parsers split them
    "deepseek_r1": [("<think>\nLet me see.</think>\n\nHello!", "\nLet me see.", "\n\nHello!"),
                    ("Opened in the prompt.</think>Hi", "Opened in the prompt.", "Hi"),
                    ("Still thinking when cut off", "Still thinking when cut off", "")],
    "qwen3": [("<think>\nLet me see.</think>\n\nHello!", "\nLet me see.", "\n\nHello!"),
              ("Let me see.</think>\n\nHello!", "Let me see.", "\n\nHello!"),  # Qwen3-Thinking-2507: <think> in the prompt
              ("Still thinking when cut off", "Still thinking when cut off", ""),
              ("I need the weather.<tool_call>\n{}", "I need the weather.", "<tool_call>\n{}"),  # Qwen3.5: a call ends it
              ("<think>cut off", "cut off", "")],
    "qwen3 thinking off": [("No thinking here.", None, "No thinking here."),  # enable_thinking: false
                           ("<think>a</think>b", "a", "b")],
}


@pytest.mark.parametrize("name,text,reasoning,content", [(n, *case) for n, cases in CASES.items() for case in cases])
def test_parsers_split_and_stream_the_same_split(name, text, reasoning, content):
    from functools import partial

    from llmctl.engine.reasoning import ReasoningParserManager
    from llmctl.server.chat_message import StreamedMessage, full_message

    parser = ReasoningParserManager.get_reasoning_parser(name.split()[0])
    parser = partial(parser, thinking=not name.endswith("thinking off"))
    message, _ = full_message(text, "stop", None, parser())
    assert (message["reasoning_content"], message["content"]) == (reasoning, content or None)
    assert message["reasoning"] == message["reasoning_content"]
    for step in (1, 3, 5):
        stream, got_reasoning, got_content = StreamedMessage(None, parser()), None, ""
        for end in list(range(step, len(text), step)) + [len(text)]:
            delta = stream.delta(text[:end], final=end == len(text))
            if "reasoning_content" in delta:
                got_reasoning = (got_reasoning or "") + delta["reasoning_content"]
            got_content += delta.get("content", "")
        assert (got_reasoning or None, got_content) == (reasoning or None, content), step


def test_the_grammar_waits_for_the_end_of_the_reasoning(default_source):
    from transformers import AutoTokenizer

    from llmctl.engine.structured.manager import StructuredOutputManager
    from llmctl.engine.structured.params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    end = tuple(tokenizer.encode("</think>", add_special_tokens=False))  # several tokens here: a sequence
    manager = StructuredOutputManager(tokenizer, 49152, [tokenizer.eos_token_id], reasoning_end_ids=end)
    gate = manager.matcher(StructuredOutputsParams(choice=("yes", "no")))
    maybe, yes = (tokenizer.encode(word, add_special_tokens=False)[0] for word in ("maybe", "yes"))
    assert bool(manager.bitmask(gate).eq(-1).all())  # thinking: every token allowed
    assert gate.accept(maybe) and all(gate.accept(t) for t in end)
    assert not gate.accept(maybe) and gate.accept(yes)  # the answer: the grammar's
    gate.rollback(1 + len(end))  # back into the thinking: anything goes again
    assert gate.accept(maybe) and not gate.is_terminated
    # a prompt that closed an empty think block (enable_thinking: false) starts the answer: the grammar at once
    start = tuple(tokenizer.encode("<think>", add_special_tokens=False))
    manager = StructuredOutputManager(tokenizer, 49152, [tokenizer.eos_token_id], reasoning_end_ids=end,
                                      reasoning_start_ids=start)
    closed = tokenizer.encode("user: hi\nassistant:<think>\n\n</think>\n\n", add_special_tokens=False)
    opened = tokenizer.encode("user: hi\nassistant:<think>\n", add_special_tokens=False)
    assert not manager.matcher(StructuredOutputsParams(choice=("yes", "no")), closed).accept(maybe)
    assert manager.matcher(StructuredOutputsParams(choice=("yes", "no")), opened).accept(maybe)


def serve(folder, *flags):
    from helpers.server_helpers import start_server

    server = start_server(str(folder), "--max-model-len", "512", "--dtype", "float32", *flags)
    return server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory, tokenizer):
    from transformers import AutoTokenizer, LlamaConfig

    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.add_tokens(["<think>", "</think>"])  # as Qwen3's: added, not special
    tokenizer.chat_template = TEMPLATE
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return save_random_model(config, tmp_path_factory.mktemp("thinking"), tokenizer), tokenizer


def streamed(client, **request):
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta.model_dump()
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
    return reasoning, content


def test_qwen3_reasoning_is_split_whole_and_streamed(thinking_model):
    folder, tokenizer = thinking_model
    server, client = serve(folder, "--reasoning-parser", "qwen3",
                           "--structured-outputs-config", '{"enable_in_reasoning": true, "disable_any_whitespace": true}')
    try:
        text = "<think>I should greet.</think>Hello there!"
        request = dict(model=str(folder), messages=ASK, max_tokens=60,
                       extra_body={"structured_outputs": {"regex": re.escape(text)}})
        message = client.chat.completions.create(**request).choices[0].message.model_dump()
        assert (message["reasoning_content"], message["reasoning"], message["content"]) == \
            ("I should greet.", "I should greet.", "Hello there!")
        assert streamed(client, **request) == ("I should greet.", "Hello there!")
        # enable_thinking: false reaches the template (an empty think block closes the prompt): no reasoning
        off = dict(request, extra_body={"structured_outputs": {"regex": "Hello!"},
                                        "chat_template_kwargs": {"enable_thinking": False}})
        message = client.chat.completions.create(**off).choices[0].message.model_dump()
        assert message["reasoning_content"] is None and message["content"] == "Hello!"
        check_anthropic_thinking(server, str(folder), text)
        status, tokens = post(server, "/tokenize", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200
        assert tokenizer.decode(tokens["tokens"]).endswith("assistant<think>\n\n</think>\n\n")
        # enable_in_reasoning: the grammar holds from the first token, so a JSON answer has no thinking (the
        # thinking turned off, as vLLM's current parser takes a tagless answer of a thinking prompt as reasoning)
        json_only = dict(request, extra_body={"logit_bias": {str(tokenizer.convert_tokens_to_ids("</think>")): 100},
                                              "chat_template_kwargs": {"enable_thinking": False}},
                         response_format={"type": "json_schema", "json_schema": {"name": "g", "schema": SCHEMA}})
        message = client.chat.completions.create(**json_only).choices[0].message
        jsonschema.validate(json.loads(message.content), SCHEMA)
        assert message.model_dump()["reasoning_content"] is None
    finally:
        server.stop()


def check_anthropic_thinking(server, model: str, text: str) -> None:
    """/v1/messages with the anthropic SDK: the reasoning as a thinking block (streamed too); thinking
    disabled reaches the template; display "omitted" sends the block empty."""
    import anthropic

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused")
    request = dict(model=model, max_tokens=60, messages=ASK, extra_body={"structured_outputs": {"regex": re.escape(text)}})
    reply = claude.messages.create(**request)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content] == \
        [("thinking", "I should greet."), ("text", "Hello there!")] and reply.content[0].signature
    with claude.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert [b.model_dump(exclude={"signature"}) for b in streamed.content] == \
        [b.model_dump(exclude={"signature"}) for b in reply.content]
    off = claude.messages.create(**{**request, "extra_body": {"structured_outputs": {"regex": "Hello!"}}},
                                 thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in off.content] == [("text", "Hello!")]
    omitted = claude.messages.create(**request, thinking={"type": "adaptive", "display": "omitted"})
    assert [(b.type, getattr(b, "thinking", None)) for b in omitted.content] == [("thinking", ""), ("text", None)]


def test_deepseek_v3_thinks_only_when_the_request_turns_thinking_on(thinking_model):
    """vLLM's deepseek_v3 parser: deepseek_r1's split when chat_template_kwargs say thinking (or
    enable_thinking) true, else the whole text is the answer — the request's kwargs reach the parser."""
    folder, _ = thinking_model
    server, client = serve(folder, "--reasoning-parser", "deepseek_v3",
                           "--structured-outputs-config", '{"enable_in_reasoning": true, "disable_any_whitespace": true}')
    try:
        forced = {"structured_outputs": {"regex": re.escape("<think>a</think>b")}}
        request = dict(model=str(folder), messages=ASK, max_tokens=30)
        for kwargs, expected in [(None, (None, "<think>a</think>b")), ({"thinking": True}, ("a", "b")),
                                 ({"enable_thinking": True}, ("a", "b"))]:
            body = forced | ({"chat_template_kwargs": kwargs} if kwargs else {})
            message = client.chat.completions.create(**request, extra_body=body).choices[0].message.model_dump()
            assert (message["reasoning_content"], message["content"]) == expected, kwargs
            assert streamed(client, **request, extra_body=body) == (expected[0] or "", expected[1]), kwargs
    finally:
        server.stop()


def test_structured_outputs_constrain_only_the_answer(thinking_model):
    folder, tokenizer = thinking_model
    # a random model writes JSON whitespace without end: none allowed, as vLLM's option says
    server, client = serve(folder, "--reasoning-parser", "deepseek_r1",
                           "--structured-outputs-config", '{"disable_any_whitespace": true}')
    try:
        end_id = tokenizer.convert_tokens_to_ids("</think>")
        request = dict(model=str(folder), messages=ASK, max_tokens=60, temperature=0,
                       response_format={"type": "json_schema", "json_schema": {"name": "g", "schema": SCHEMA}},
                       extra_body={"logit_bias": {str(end_id): 100}, "logprobs": True})
        reply = client.chat.completions.create(**request).choices[0]
        # the biased end marker came first (the grammar was not yet on), then the grammar made the answer
        assert reply.logprobs.content[0].token == "</think>" and reply.message.model_dump()["reasoning_content"] == ""
        jsonschema.validate(json.loads(reply.message.content), SCHEMA)
        assert streamed(client, **request) == ("", reply.message.content)
    finally:
        server.stop()


def test_an_unknown_reasoning_parser_is_one_line():
    from helpers.cli_process import run_cli

    result = run_cli("serve", "--port", "0", "--reasoning-parser", "nope")
    assert result.returncode == 2 and "deepseek_r1, deepseek_v3, ernie45, glm45, granite, hunyuan_a13b, minimax_m2, mistral, olmo3, openai_gptoss, qwen3, seed_oss, step3" in result.stderr and "Traceback" not in result.stderr


def test_bitmask_rows_of_thinking_requests_allow_everything():
    from llmctl.engine.structured.reasoning_gate import ReasoningGate

    class Refusing:  # a grammar that would refuse everything: not consulted while thinking
        is_terminated = False

        def fill_bitmask(self, bitmask, row):
            bitmask[row].fill_(0)

    gate, mask = ReasoningGate(Refusing(), (7,)), torch.zeros(2, 4, dtype=torch.int32)
    gate.fill_bitmask(mask, 1)
    assert mask[1].eq(-1).all() and mask[0].eq(0).all()
