"""Structured outputs (issue 35) on the default model through `llmctl serve` and the official openai client:
the SDK's `parse()` with pydantic models, every output valid under jsonschema, regex and choice outputs that
match, streaming and n > 1; greedy tokens identical to transformers generating with xgrammar's own logits
processor for the same grammar (an implementation of the masking independent of llmctl's); bad specs are 400s."""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Annotated, Literal

import jsonschema
import pytest
import torch
from pydantic import BaseModel, Field

from helpers.server_helpers import post

PROMPT = [{"role": "user", "content": "Describe a person, a city and a few numbers as JSON."}]


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)


class Address(BaseModel):
    city: str = Field(max_length=16)
    zip: str = Field(pattern=r"^[0-9]{5}$")


class WithAddress(BaseModel):
    person: Person
    address: Address


class Tags(BaseModel):
    tags: list[str] = Field(min_length=1, max_length=3)


class Paint(BaseModel):
    color: Color
    shade: Literal["light", "dark"]


class Optional_(BaseModel):
    title: str = Field(max_length=12)
    subtitle: str | None = Field(default=None, max_length=12)


class Bounded(BaseModel):
    ratio: float = Field(ge=0.0, le=1.0)
    count: int = Field(ge=1, le=9)


class Code(BaseModel):
    code: str = Field(pattern=r"^[A-Z]{3}-[0-9]{2}$")


class Flags(BaseModel):
    enabled: bool
    retries: int = Field(ge=0, le=5)


class Matrix(BaseModel):  # every list and number bounded: the model must be able to finish within max_tokens
    rows: list[Annotated[list[Annotated[int, Field(ge=0, le=99)]], Field(min_length=1, max_length=3)]] = \
        Field(min_length=1, max_length=2)


SCHEMAS = [Person, WithAddress, Tags, Paint, Optional_, Bounded, Code, Flags, Matrix, Address]


@pytest.mark.parametrize("model_class", SCHEMAS, ids=lambda m: m.__name__)
def test_parse_returns_a_valid_object_for_each_schema(client, model_class):
    completion = client.chat.completions.parse(model=client.models.list().data[0].id, messages=PROMPT,
                                               response_format=model_class, temperature=0, max_tokens=200)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop", message.content
    assert isinstance(message.parsed, model_class)
    jsonschema.validate(json.loads(message.content), model_class.model_json_schema())


def test_regex_choice_and_grammar_through_vllm_fields(client):
    model = client.models.list().data[0].id

    def chat(**extra) -> str:
        return client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=40,
                                              extra_body=extra).choices[0].message.content

    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", chat(structured_outputs={"regex": r"[0-9]{3}-[0-9]{4}"}))
    assert re.fullmatch(r"[a-z]{1,8}@[a-z]{1,8}\.com", chat(guided_regex=r"[a-z]{1,8}@[a-z]{1,8}\.com"))
    assert chat(structured_outputs={"choice": ["positive", "negative"]}) in ("positive", "negative")
    assert chat(guided_choice=["yes", "no", "it \"depends\""]) in ("yes", "no", "it \"depends\"")
    assert re.fullmatch(r"a[bc]*d", chat(guided_grammar='root ::= "a" ("b" | "c")* "d"'))


def test_completions_endpoint_and_json_object(client):
    model = client.models.list().data[0].id
    texts = []
    for extra in ({"response_format": {"type": "json_object"}}, {"structured_outputs": {"json_object": True}}):
        out = client.completions.create(model=model, prompt="Output a small JSON object with a name field.\n", max_tokens=120,
                                        temperature=0, extra_body=extra)
        assert out.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(out.choices[0].text), dict)
        texts.append(out.choices[0].text)
    assert texts[0] == texts[1]  # the same constraint, however it is asked for


def test_streamed_and_sampled_outputs_are_valid(client):
    model = client.models.list().data[0].id
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": Person.model_json_schema()}}
    stream = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=200, stream=True,
                                            temperature=0, response_format=schema)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    Person.model_validate_json(text)
    sampled = client.chat.completions.create(model=model, messages=PROMPT, max_tokens=200, n=4, seed=3,
                                             temperature=1.0, response_format=schema)
    assert len(sampled.choices) == 4
    for choice in sampled.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), Person.model_json_schema())


def test_text_response_format_changes_nothing(client):
    model = client.models.list().data[0].id
    plain, text = (client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=16,
                                                  **extra).choices[0].message.content
                   for extra in ({}, {"response_format": {"type": "text"}}))
    assert plain == text


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "structured_outputs", "Unsupported type"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs", "parenthesis"),
    ({"guided_grammar": "root ::= missing_rule"}, "structured_outputs", "missing_rule"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "only one"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "not supported"),
    ({"structured_outputs": {"json": 3}}, "structured_outputs", "JSON schema object"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"guided_decoding_backend": "outlines", "guided_regex": "a"}, "guided_decoding_backend", "backend is 'auto'"),
])
def test_bad_specs_are_400s_that_say_what_is_wrong(server, body, param, words):
    status, answer = post(server, "/v1/chat/completions", {"messages": PROMPT, "max_tokens": 4, **body})
    assert status == 400, answer
    assert answer["error"]["param"] == param and words in answer["error"]["message"], answer


def test_greedy_tokens_equal_transformers_with_xgrammars_logits_processor(default_source):
    """The same compiled grammar applied by xgrammar's own transformers integration: identical tokens."""
    import xgrammar
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmctl import LLM, SamplingParams
    from llmctl.engine.structured.params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    model = AutoModelForCausalLM.from_pretrained(str(default_source.path), dtype=torch.float32).eval()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size,
                                                   stop_token_ids=[tokenizer.eos_token_id])
    compiler = xgrammar.GrammarCompiler(info)
    prompt = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    specs = {"json": (StructuredOutputsParams(json=WithAddress.model_json_schema()),
                      compiler.compile_json_schema(json.dumps(WithAddress.model_json_schema()))),
             "regex": (StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,5}"), compiler.compile_regex(r"[0-9]{3}-[a-z]{2,5}"))}
    llm = LLM(str(default_source.path), max_model_len=1024)
    try:
        for name, (params, compiled) in specs.items():
            ours = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=120, structured_outputs=params))
            with torch.no_grad():
                ref = model.generate(ids, do_sample=False, max_new_tokens=120, pad_token_id=tokenizer.eos_token_id,
                                     logits_processor=[xgrammar.contrib.hf.LogitsProcessor(compiled)])
            assert ours[0].outputs[0].token_ids == ref[0, ids.shape[1]:].tolist(), name
    finally:
        llm.shutdown()


def test_lark_grammar_falls_back_to_llguidance_under_auto(client):
    """vLLM's auto backend: xgrammar compiles what it can, llguidance what xgrammar refuses (Lark syntax)."""
    model = client.models.list().data[0].id
    text = client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=20, extra_body={
        "structured_outputs": {"grammar": 'start: "x" ("y" | "z")~1..4 "!"'}}).choices[0].message.content
    assert re.fullmatch(r"x[yz]{1,4}!", text), text


def test_the_guidance_backend_agrees_with_xgrammar(default_source):
    """Two grammar engines written independently: for a regex and a choice the greedy texts are identical
    (not always the tokens: the engines differ on some tokenizations of the same text); for a JSON schema
    both outputs are valid (they may differ where a token spans two JSON lexemes). The schema closes its
    objects: xgrammar,
    as vLLM runs it, refuses properties a schema does not name; llguidance allows them unless
    additionalProperties is false, as JSON Schema says."""
    from llmctl import LLM, SamplingParams
    from llmctl.engine.structured.params import StructuredOutputsParams

    closed = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"], "properties": {
        "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}}}
    specs = [StructuredOutputsParams(json=closed), StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2,5}"),
             StructuredOutputsParams(choice=("alpha", "beta", "gamma"))]
    outputs = {}
    for backend in ("xgrammar", "guidance"):
        llm = LLM(str(default_source.path), max_model_len=1024, structured_outputs_config={"backend": backend})
        try:
            prompt = llm.get_tokenizer().apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
            outputs[backend] = [llm.generate([prompt], SamplingParams(temperature=0, max_tokens=120,
                                                                      structured_outputs=spec))[0].outputs[0]
                                for spec in specs]
        finally:
            llm.shutdown()
    for ours, theirs in zip(outputs["xgrammar"][1:], outputs["guidance"][1:]):
        assert ours.text == theirs.text and theirs.finish_reason == "stop", (ours.text, theirs.text)
    for backend in outputs:
        assert outputs[backend][0].finish_reason == "stop"
        jsonschema.validate(json.loads(outputs[backend][0].text), closed)


@pytest.mark.parametrize("value,backend,words", [
    ('{"backend": "outlines"}', None, "'outlines' is not one of auto, xgrammar, guidance"),
    ('{"backend": "guidance", "disable_fallback": true}', None, "disable_fallback is not supported"),
    ("{backend", None, "is not JSON"),
    (None, "lm-format-enforcer", "'lm-format-enforcer' is not one of"),
])
def test_server_backend_flags_are_checked_before_startup(value, backend, words):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match=re.escape(words)):
        EngineConfig(structured_outputs_config=value, guided_decoding_backend=backend).validate()


def test_pipeline_parallel_samples_under_the_grammar_on_its_last_stage(default_source):
    """With PP 2 the last stage samples (the bitmask travels in each row's SampleInput): the tokens are one
    process's."""
    from llmctl import LLM, SamplingParams
    from llmctl.engine.structured.params import StructuredOutputsParams

    params = [SamplingParams(temperature=0, max_tokens=80, structured_outputs=StructuredOutputsParams(json=schema))
              for schema in (Person.model_json_schema(), Paint.model_json_schema())]
    params.append(SamplingParams(temperature=0.8, seed=4, max_tokens=30,
                                 structured_outputs=StructuredOutputsParams(regex=r"[a-z]{2,6}( [a-z]{2,6}){2,4}\.")))
    outputs = []
    for pp in (1, 2):
        llm = LLM(str(default_source.path), max_model_len=512, pipeline_parallel_size=pp)
        try:
            prompt = llm.get_tokenizer().apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
            outputs.append([o.outputs[0].token_ids for o in llm.generate([prompt] * 3, params)])
        finally:
            llm.shutdown()
    assert outputs[0] == outputs[1]


def test_langchain_with_structured_output(server):
    """A client nobody here wrote: LangChain's ChatOpenAI.with_structured_output (json_schema method)."""
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="HuggingFaceTB/SmolLM2-135M-Instruct",
                      temperature=0, max_tokens=200)
    for model_class in (Person, Paint):
        result = chat.with_structured_output(model_class, method="json_schema").invoke(PROMPT[0]["content"])
        assert isinstance(result, model_class)


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_a_matcher_walks_a_draft_past_its_stop_token_and_rolls_back(default_source, backend):
    """What speculative decoding does with a draft: accept tokens (the grammar's last one, then the stop
    token), refuse one the grammar does not allow without losing its place, and roll back to the start."""
    from transformers import AutoTokenizer

    from llmctl.engine.structured.manager import StructuredOutputManager
    from llmctl.engine.structured.params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    manager = StructuredOutputManager(tokenizer, 49152, [tokenizer.eos_token_id])
    matcher = manager.backend(backend).compile(StructuredOutputsParams(choice=("yes", "no")))
    start = manager.bitmask(matcher).clone()
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert len(yes) == 1 and not matcher.accept(tokenizer.encode("maybe", add_special_tokens=False)[0])
    assert torch.equal(manager.bitmask(matcher), start)  # a refused token changes nothing
    assert matcher.accept(yes[0]) and matcher.accept(tokenizer.eos_token_id) and matcher.is_terminated
    matcher.rollback(2)
    assert not matcher.is_terminated and torch.equal(manager.bitmask(matcher), start)
    assert matcher.accept(tokenizer.encode("no", add_special_tokens=False)[0])


@pytest.mark.parametrize("backend", ["xgrammar", "guidance"])
def test_structural_tags_constrain_what_follows_a_trigger(default_source, backend):
    """vLLM's structural_tag form: free text, and after a trigger the structure's begin, its JSON schema and
    its end; both backends (llguidance through its StructTag grammar, as vLLM's guidance backend builds it)."""
    from transformers import AutoTokenizer

    from llmctl.engine.structured.manager import StructuredOutputManager
    from llmctl.engine.structured.params import StructuredOutputsParams

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    manager = StructuredOutputManager(tokenizer, 49152, [tokenizer.eos_token_id])
    tag = {"type": "structural_tag", "triggers": ["<function="], "structures": [{
        "begin": "<function=get_weather>", "end": "</function>",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}]}

    def walk(text: str) -> bool:
        matcher = manager.backend(backend).compile(StructuredOutputsParams(structural_tag=json.dumps(tag)))
        return all(matcher.accept(token) for token in tokenizer.encode(text, add_special_tokens=False))

    assert walk('Let me look. <function=get_weather>{"city": "Paris"}</function> Done.')
    assert not walk('Let me look. <function=get_weather>{"city": 5}</function>')
    assert not walk('<function=get_weather>{"town": "Paris"}</function>')


def test_bitmasks_are_filled_beside_the_forward(default_source):
    """The step's grammar masks are computed on llmctl's mask thread while the forward runs (vLLM overlaps
    them with the GPU), and the greedy output is what the grammar allows."""
    import threading

    from llmctl import LLM, SamplingParams
    from llmctl.engine.structured.params import StructuredOutputsParams

    llm = LLM(None, max_model_len=256)
    manager, threads = llm.engine.structured, []
    fill = manager.bitmask

    def recording(matcher):
        threads.append(threading.current_thread().name)
        return fill(matcher)

    manager.bitmask = recording
    params = SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(
        choice=("red", "green", "blue")))
    [output] = llm.generate(["Pick a colour:"], params)
    assert output.outputs[0].text in ("red", "green", "blue")
    assert threads and all(name.startswith("llmctl-bitmask") for name in threads), threads
