"""No field without an effect: every field /v1/chat/completions and /v1/completions publish is sent to the
shared server and observed to change the answer (or to be a 400 naming it), against a greedy baseline;
the fields whose effect needs another server (a tool parser, images, a draft model, a template that reads
a variable) name the test that observes it, and that test must exist. The other request models' fields
(/v1/responses, /v1/messages, /v1/embeddings, /tokenize, /detokenize) each name their test too, and the
fields accepted without an effect are listed with the reason. A field added later without an entry here
fails this module."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.server_helpers import post

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Count: one, two, three,"}]
HI = [{"role": "user", "content": "Say hi."}]  # answered in a few tokens, then the end of the turn
SAMPLED = {"temperature": 1.5, "seed": 11, "max_tokens": 12}


def chat(server, **fields) -> dict:
    status, body = post(server, "/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 8,
                                                          "temperature": 0, **fields})
    assert status == 200, body
    return body


def text(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def tokens(body: dict) -> int:
    return body["usage"]["completion_tokens"]


def refused(server, path: str, field: str, value) -> None:
    base = {"prompt": "Hi"} if path == "/v1/completions" else {"messages": ASK}
    status, body = post(server, path, {"model": MODEL, "max_tokens": 2, **base, field: value})
    assert status == 400 and body["error"]["param"] == field, body


# Each probe sends the field and checks what it changed against the greedy baseline (or a sampled one).
def probe_chat(server, field: str, tokenizer) -> None:
    base = chat(server)
    first_word = text(base).split()[0]
    piece = tokenizer.encode(" x", add_special_tokens=False)[0]
    checks = {
        "messages": lambda: tokens(base) and chat(server, messages=[{"role": "user", "content": "Hi"}])[
            "usage"]["prompt_tokens"] != base["usage"]["prompt_tokens"],
        "model": lambda: post(server, "/v1/chat/completions", {"model": "nope", "messages": ASK})[0] == 404,
        "max_tokens": lambda: tokens(chat(server, max_tokens=2)) == 2,
        "max_completion_tokens": lambda: tokens(chat(server, max_tokens=None, max_completion_tokens=3)) == 3,
        "temperature": lambda: text(chat(server, **SAMPLED)) != text(chat(server, **{**SAMPLED, "temperature": 0})),
        "seed": lambda: text(chat(server, **SAMPLED)) != text(chat(server, **{**SAMPLED, "seed": 12})),
        "top_k": lambda: text(chat(server, **SAMPLED, top_k=1)) == text(chat(server, max_tokens=12)),
        "top_p": lambda: text(chat(server, **SAMPLED, top_p=1e-6)) == text(chat(server, max_tokens=12)),
        "min_p": lambda: text(chat(server, **SAMPLED, min_p=1.0)) == text(chat(server, max_tokens=12)),
        "n": lambda: len(chat(server, n=2)["choices"]) == 2,
        "stop": lambda: text(chat(server, stop=[first_word])) == text(base)[:text(base).index(first_word)],
        "include_stop_str_in_output": lambda: text(chat(server, stop=[first_word], include_stop_str_in_output=True))
        .endswith(first_word),
        "stop_token_ids": lambda: _stops_at_once(chat(server, stop_token_ids=[_first_id(server, tokenizer)])),
        "logit_bias": lambda: text(chat(server, logit_bias={str(piece): 100})) == " x" * 8,
        "allowed_token_ids": lambda: text(chat(server, allowed_token_ids=[piece])) == " x" * 8,
        "bad_words": lambda: first_word not in text(chat(server, bad_words=[first_word])),
        "repetition_penalty": lambda: text(chat(server, max_tokens=24, repetition_penalty=1.8)) != text(
            chat(server, max_tokens=24)),
        "presence_penalty": lambda: text(chat(server, max_tokens=24, presence_penalty=2)) != text(
            chat(server, max_tokens=24)),
        "frequency_penalty": lambda: text(chat(server, max_tokens=24, frequency_penalty=2)) != text(
            chat(server, max_tokens=24)),
        "ignore_eos": lambda: tokens(chat(server, messages=HI, max_tokens=60, ignore_eos=True)) == 60 > tokens(
            chat(server, messages=HI, max_tokens=60)),
        "min_tokens": lambda: tokens(chat(server, messages=HI, max_tokens=60, min_tokens=50)) >= 50 > tokens(
            chat(server, messages=HI, max_tokens=60)),
        "logprobs": lambda: chat(server, logprobs=True)["choices"][0]["logprobs"] is not None,
        "top_logprobs": lambda: len(chat(server, logprobs=True, top_logprobs=3)["choices"][0]["logprobs"][
            "content"][0]["top_logprobs"]) == 3,
        "prompt_logprobs": lambda: chat(server, prompt_logprobs=0)["prompt_logprobs"][1] is not None,
        "add_generation_prompt": lambda: chat(server, add_generation_prompt=False)["usage"]["prompt_tokens"] <
        base["usage"]["prompt_tokens"],
        "response_format": lambda: isinstance(json.loads(text(chat(server, max_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "properties": {
                "n": {"type": "integer"}}, "required": ["n"]}}}))), dict),
        "structured_outputs": lambda: re.fullmatch("[a-c]{3}", text(chat(server, structured_outputs={
            "regex": "[a-c]{3}"}))) is not None,
        "guided_regex": lambda: re.fullmatch("[0-9]{2}", text(chat(server, guided_regex="[0-9]{2}"))) is not None,
        "guided_choice": lambda: text(chat(server, guided_choice=["yes", "no"])) in ("yes", "no"),
        "guided_json": lambda: isinstance(json.loads(text(chat(server, max_tokens=40, guided_json={
            "type": "array", "maxItems": 2, "items": {"type": "integer"}}))), list),
        "guided_grammar": lambda: text(chat(server, guided_grammar='root ::= "ab" "c"?')) in ("ab", "abc"),
        "stream": lambda: _sse(server, {"stream": True}).endswith("data: [DONE]"),
        "stream_options": lambda: '"usage": {' in _sse(server, {"stream": True, "stream_options": {
            "include_usage": True}}).split("data: ")[-2],
        "priority": lambda: refused(server, "/v1/chat/completions", "priority", 1) is None,  # fcfs: refused
        "skip_special_tokens": lambda: "<|im_end|>" in text(chat(server, skip_special_tokens=False, ignore_eos=True,
                                                                    max_tokens=80, logit_bias={"2": 100})),
    }
    assert checks[field](), field


def _first_id(server, tokenizer) -> int:
    """The id of the greedy answer's first token."""
    return int(tokenizer.encode(text(chat(server, max_tokens=1)), add_special_tokens=False)[0])


def _stops_at_once(body: dict) -> bool:
    """vLLM's rule: the stop token (not a special one) stays in the output, and is the stop_reason."""
    return tokens(body) == 1 and body["choices"][0]["finish_reason"] == "stop" and \
        isinstance(body["choices"][0]["stop_reason"], int)


def _sse(server, fields: dict) -> str:
    import urllib.request

    request = urllib.request.Request(server.url + "/v1/chat/completions", method="POST", data=json.dumps(
        {"model": MODEL, "messages": ASK, "max_tokens": 3, "temperature": 0, **fields}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read().decode().strip()


# Fields whose effect needs another server or model, and the test that observes it
ELSEWHERE = {
    "tools": "tests/server/test_tools.py::test_auto_reads_hermes_calls_out_of_the_text",
    "tool_choice": "tests/server/test_tools.py::test_a_named_function_is_called_with_valid_arguments",
    "parallel_tool_calls": "tests/server/test_tools.py::test_parallel_tool_calls_false_allows_one_call",
    "chat_template_kwargs": "tests/server/test_reasoning.py::test_qwen3_reasoning_is_split_whole_and_streamed",
    "reasoning_effort": "tests/server/test_vllm_serve_flags.py::test_vllms_flags_have_vllms_meaning",
    "continue_final_message": "tests/engine/sample/test_token_controls.py::"
                              "test_continue_final_message_goes_on_from_the_assistants_text",
    "mm_processor_kwargs": "tests/server/test_images.py::test_mm_processor_kwargs_reach_the_processor",
    "disable_spec_decode": "tests/engine/spec_decode/test_spec_decode.py::"
                           "test_requests_that_opt_out_and_full_batches_do_not_propose",
    "use_beam_search": "tests/engine/sample/test_beam_search.py::test_use_beam_search_through_the_server",
    "length_penalty": "tests/engine/sample/test_beam_search.py::test_use_beam_search_through_the_server",
    "echo": "tests/server/test_server.py::test_echo_returns_the_prompt",
    "prompt": "tests/server/test_server.py::test_models_and_greedy_completion",
}
ACCEPTED_WITHOUT_EFFECT = {  # OpenAI's identifiers and bookkeeping: no answer depends on them, by design
    "user": "an end-user identifier for the caller's records", "metadata": "the caller's key-value records",
    "store": "nothing is stored: /v1/responses answers store false", "service_tier": "one tier: the server",
    "safety_identifier": "an end-user identifier for the caller's records",
    "prompt_cache_key": "a hint for prefix caching, which llmctl does for every request",
    "cache_control": "Anthropic's hint for prefix caching, which llmctl does for every request",
}


def chat_and_completion_fields() -> list[str]:
    from llmctl.server.protocol import CHAT_FIELDS, COMPLETION_FIELDS

    return sorted(set(CHAT_FIELDS) | set(COMPLETION_FIELDS))


@pytest.mark.parametrize("field", [f for f in chat_and_completion_fields() if f not in ELSEWHERE])
def test_each_chat_field_changes_the_answer_or_is_refused(server, tokenizer, field):
    probe_chat(server, field, tokenizer)


def test_every_published_field_has_an_effect_here_or_a_test_that_observes_it():
    from llmctl.server.messages_api.request import ACCEPTED as MESSAGES_ACCEPTED
    from llmctl.server.protocol import DETOKENIZE_FIELDS, EMBEDDING_FIELDS, IGNORED, TOKENIZE_FIELDS, UNSUPPORTED
    from llmctl.server.responses_api.request import ACCEPTED as RESPONSES_ACCEPTED

    missing = [f for f in chat_and_completion_fields() if f not in ELSEWHERE and f not in _probe_names()]
    assert not missing, f"fields with neither a probe nor a test that observes them: {missing}"
    others = {**OTHER_ENDPOINTS}
    for field in (*RESPONSES_ACCEPTED, *MESSAGES_ACCEPTED, *EMBEDDING_FIELDS, *TOKENIZE_FIELDS, *DETOKENIZE_FIELDS):
        assert field in others or field in chat_and_completion_fields() or field in ACCEPTED_WITHOUT_EFFECT, field
    assert set(IGNORED) <= set(ACCEPTED_WITHOUT_EFFECT) and set(UNSUPPORTED) <= set(REFUSED_BY_NAME)
    for where in [*ELSEWHERE.values(), *others.values()]:
        path, name = where.split("::")
        assert f"def {name}(" in (ROOT / path).read_text(), where


def _probe_names() -> set[str]:
    source = Path(__file__).read_text()
    body = source[source.index("    checks = {"):source.index("    assert checks[field]")]
    return set(re.findall(r'^        "([a-z_]+)":', body, re.MULTILINE))


REFUSED_BY_NAME = {  # a 400 naming the field: tests/server/test_server.py and the fuzz test send them
    "functions", "function_call", "suffix", "best_of", "audio", "modalities", "prediction",
}
OTHER_ENDPOINTS = {  # /v1/responses, /v1/messages, /v1/embeddings, /tokenize, /detokenize: the test observing each
    "input": "tests/server/test_responses_api.py::test_text_in_and_out_is_the_chat_completion_it_means",
    "instructions": "tests/server/test_responses_api.py::test_text_in_and_out_is_the_chat_completion_it_means",
    "max_output_tokens": "tests/server/test_responses_api.py::test_max_output_tokens_makes_an_incomplete_response",
    "text": "tests/server/test_responses_api.py::test_text_format_with_the_sdks_parse",
    "include": "tests/server/test_responses_api.py::test_what_is_not_answered_is_a_400_naming_the_field",
    "truncation": "tests/server/test_responses_api.py::test_what_is_not_answered_is_a_400_naming_the_field",
    "reasoning": "tests/server/test_vllm_serve_flags.py::test_vllms_flags_have_vllms_meaning",
    "previous_response_id": "tests/server/test_responses_api.py::test_what_is_not_answered_is_a_400_naming_the_field",
    "background": "tests/server/test_responses_api.py::test_what_is_not_answered_is_a_400_naming_the_field",
    "conversation": "tests/server/test_responses_api.py::test_what_is_not_answered_is_a_400_naming_the_field",
    "prompt": "tests/server/test_server.py::test_models_and_greedy_completion",
    "system": "tests/server/test_anthropic_messages.py::test_text_is_the_chat_completion_it_means",
    "stop_sequences": "tests/server/test_anthropic_messages.py::test_a_stop_sequence_ends_the_turn_and_is_named",
    "thinking": "tests/server/test_reasoning.py::test_qwen3_reasoning_is_split_whole_and_streamed",
    "output_config": "tests/server/test_anthropic_messages.py::test_errors_are_anthropics_and_the_sdk_raises_its_own",
    "mcp_servers": "tests/server/test_anthropic_messages.py::test_errors_are_anthropics_and_the_sdk_raises_its_own",
    "container": "tests/server/test_anthropic_messages.py::test_errors_are_anthropics_and_the_sdk_raises_its_own",
    "context_management": "tests/server/test_anthropic_messages.py::test_errors_are_anthropics_and_the_sdk_raises_its_own",
    "encoding_format": "tests/server/test_pooling_server.py::test_openai_embeddings_equal_sentence_transformers",
    "dimensions": "tests/server/test_embedding_dimensions.py::test_dimensions_cut_as_sentence_transformers_truncate_dim",
    "normalize": "tests/server/test_pooling_server.py::test_openai_embeddings_equal_sentence_transformers",
    "add_special_tokens": "tests/server/test_every_field.py::test_tokenize_reads_add_special_tokens_as_transformers",
    "tokens": "tests/server/test_server.py::test_version_openapi_docs_detokenize",
}


def test_tokenize_reads_add_special_tokens_as_transformers(server, tokenizer):
    for add in (True, False):
        status, body = post(server, "/tokenize", {"prompt": "Hello there", "add_special_tokens": add})
        assert status == 200 and body["tokens"] == tokenizer.encode("Hello there", add_special_tokens=add)
