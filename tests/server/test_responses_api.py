"""/v1/responses through `llmctl serve` with the official openai client: text in and out (the same tokens
as the chat completion it means, greedy), instructions, max_output_tokens → incomplete, streaming events
the SDK's own accumulator takes (and reassemble to the whole answer), text.format structured output
(the SDK's responses.parse with a pydantic model), function tools with forced choices, a conversation
with function calls and their outputs, and what is not kept (store, previous_response_id) said."""

from __future__ import annotations

import json

import jsonschema
import pytest
from pydantic import BaseModel, Field

from helpers.server_helpers import post

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"]}}


def chat_text(client, messages, **sampling) -> str:
    return client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **sampling
                                          ).choices[0].message.content


def test_text_in_and_out_is_the_chat_completion_it_means(client):
    reply = client.responses.create(model=MODEL, input="Name a colour.", instructions="Answer in one word.",
                                    max_output_tokens=12, temperature=0)
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour."}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=12)
    assert reply.output_text == chat.choices[0].message.content and reply.output_text
    assert reply.usage.input_tokens == chat.usage.prompt_tokens
    assert reply.usage.output_tokens == chat.usage.completion_tokens
    assert reply.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert reply.id.startswith("resp_") and reply.store is False and reply.instructions == "Answer in one word."


def test_max_output_tokens_makes_an_incomplete_response(client):
    reply = client.responses.create(model=MODEL, input="Tell a long story.", max_output_tokens=3, temperature=0)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3
    assert [item.status for item in reply.output] == ["incomplete"]  # the message the cut interrupted
    events = list(client.responses.create(model=MODEL, input="Tell a long story.", max_output_tokens=3,
                                          temperature=0, stream=True))
    done = [event.item.status for event in events if event.type == "response.output_item.done"]
    final = events[-1]  # OpenAI's last event of a cut response: response.incomplete
    assert done == ["incomplete"] and final.type == "response.incomplete"
    assert final.response.output[0].status == "incomplete"


def test_streaming_events_build_the_same_response(client):
    request = dict(model=MODEL, input="Say hello.", max_output_tokens=300, temperature=0)
    whole = client.responses.create(**request)
    assert whole.status == "completed"
    with client.responses.stream(**request) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()  # the SDK's accumulator checks ids, indices and order
    assert final.output_text == whole.output_text
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int = Field(ge=0)


def test_text_format_with_the_sdks_parse(client):
    # greedy: a sampled reply depends on the shared server's earlier draws and may spend its 100 tokens on digits
    reply = client.responses.parse(model=MODEL, input="A city as JSON.", text_format=City, max_output_tokens=100,
                                   temperature=0)
    assert isinstance(reply.output_parsed, City)
    raw = client.responses.create(model=MODEL, input="A city as JSON.", max_output_tokens=100, temperature=0, text={"format": {
        "type": "json_schema", "name": "city", "schema": City.model_json_schema(), "strict": True}})
    jsonschema.validate(json.loads(raw.output_text), City.model_json_schema())


def test_function_tools_with_required_and_named_choices(client):
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        request = dict(model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice=choice,
                       max_output_tokens=80, temperature=0, parallel_tool_calls=False)
        reply = client.responses.create(**request)
        [call] = [item for item in reply.output if item.type == "function_call"]
        assert call.name == "get_weather" and call.call_id and call.id.startswith("fc_")
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        with client.responses.stream(**request) as stream:
            for _ in stream:
                pass
            [streamed] = [item for item in stream.get_final_response().output if item.type == "function_call"]
        assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_a_conversation_with_function_calls_and_outputs(client):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"}]
    reply = client.responses.create(model=MODEL, input=items, tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=10, temperature=0)
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    tools = [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}]
    assert reply.output_text == chat_text(client, messages, max_tokens=10, tools=tools, tool_choice="none")


@pytest.mark.parametrize("body,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input"),
    ({"input": []}, "input"),
    ({"text": {"format": {"type": "yaml"}}}, "text"),
    ({"include": ["message.output_text.logprobs"]}, "include"),  # output llmctl does not add
    ({"truncation": "auto"}, "truncation"),  # llmctl drops no input
    ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning"),  # nor summarises reasoning
])
def test_what_is_not_answered_is_a_400_naming_the_field(server, body, param):
    status, answer = post(server, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2, **body})
    assert status == 400 and answer["error"]["param"] == param, answer
    if param == "previous_response_id":
        assert "keeps no responses" in answer["error"]["message"]


def test_store_is_accepted_and_answered_false(server):
    status, answer = post(server, "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2,
                                                     "store": True, "metadata": {"k": "v"}})
    assert status == 200 and answer["store"] is False and answer["metadata"] == {"k": "v"}
