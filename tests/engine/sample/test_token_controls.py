"""vLLM's token-level controls against transformers' own logits processors on the default model:
logit_bias (transformers' sequence_bias), allowed_token_ids (prefix_allowed_tokens_fn) and bad_words
(bad_words_ids, with the word tokenized alone and after a space as vLLM does); greedy tokens identical.
Then the same fields through `llmctl serve` with the openai client, and the vLLM fields llmctl refuses."""

from __future__ import annotations

import pytest
import torch

from helpers.server_helpers import post
from llmctl import LLM, SamplingParams
from llmctl.engine.errors import InvalidRequestError

PROMPTS = ["The capital of France is", "My favourite fruit is the", "Once upon a time"]
TOKENS = 24


@pytest.fixture(scope="module")
def llm(default_source):
    llm = LLM(str(default_source.path), max_model_len=512)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def reference(default_source):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    model = AutoModelForCausalLM.from_pretrained(str(default_source.path), dtype=torch.float32).eval()

    def generate(prompt: str, **processors) -> list[int]:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, do_sample=False, max_new_tokens=TOKENS, min_new_tokens=TOKENS,
                                 pad_token_id=0, eos_token_id=None, **processors)
        return out[0, ids.shape[1]:].tolist()

    generate.tokenizer = tokenizer
    return generate


def ours(llm, prompt: str, **fields) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, **fields)
    return llm.generate(prompt, params)[0].outputs[0].token_ids


def test_logit_bias_equals_transformers_sequence_bias(llm, reference):
    tokenizer = reference.tokenizer
    bias = {tokenizer.encode(" Paris")[0]: -8.0, tokenizer.encode(" the")[0]: 3.5, tokenizer.encode(".")[0]: -2.0}
    for prompt in PROMPTS:
        expected = reference(prompt, sequence_bias={(token,): value for token, value in bias.items()})
        assert ours(llm, prompt, logit_bias=bias) == expected, prompt
    assert ours(llm, PROMPTS[0], logit_bias=bias) != ours(llm, PROMPTS[0])  # the bias changes this output


def test_allowed_token_ids_equal_transformers_prefix_allowed_tokens(llm, reference):
    tokenizer = reference.tokenizer
    allowed = sorted({t for word in (" a", " b", " the", " cat", " dog", ".", " and") for t in tokenizer.encode(word)})
    for prompt in PROMPTS:
        expected = reference(prompt, prefix_allowed_tokens_fn=lambda batch, ids: allowed)
        got = ours(llm, prompt, allowed_token_ids=allowed)
        assert got == expected and set(got) <= set(allowed), prompt


def test_bad_words_equal_transformers_bad_words_ids(llm, reference):
    tokenizer = reference.tokenizer
    words = ["Paris", "the", "upon a time"]
    # vLLM's rule, spelled out here: each word alone, and after a space where that is another tokenization
    ids = []
    for word in words:
        bare, spaced = tokenizer.encode(word, add_special_tokens=False), tokenizer.encode(" " + word,
                                                                                           add_special_tokens=False)
        ids += [bare] + ([spaced] if spaced[0] != bare[0] and len(spaced) == len(bare) else [])
    for prompt in PROMPTS:
        got = ours(llm, prompt, bad_words=words)
        assert got == reference(prompt, bad_words_ids=ids), prompt
        assert not any(w in llm.get_tokenizer().decode(got) for w in (" Paris", " the "))


def test_out_of_vocabulary_ids_are_refused(llm):
    for fields, param in (({"logit_bias": {10**6: 1.0}}, "logit_bias"), ({"allowed_token_ids": [-1]},
                                                                          "allowed_token_ids")):
        with pytest.raises(InvalidRequestError) as caught:
            llm.generate(PROMPTS[0], SamplingParams(max_tokens=2, **fields))
        assert caught.value.param == param


def test_served_fields_with_the_openai_client(client, llm):
    model = client.models.list().data[0].id
    tokenizer = llm.get_tokenizer()
    forced = tokenizer.encode(" banana", add_special_tokens=False)[0]
    out = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=3, temperature=0,
                                    logit_bias={str(forced): 100}, logprobs=0)
    assert out.choices[0].logprobs.tokens[0] == tokenizer.decode([forced])
    words = client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=TOKENS, temperature=0,
                                      extra_body={"bad_words": ["Paris"]}).choices[0].text
    assert "Paris" not in words
    allowed = [tokenizer.encode(" yes", add_special_tokens=False)[0], tokenizer.encode(" no", add_special_tokens=False)[0]]
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                           max_tokens=4, temperature=0, extra_body={"allowed_token_ids": allowed})
    assert set(tokenizer.encode(reply.choices[0].message.content, add_special_tokens=False)) <= set(allowed)


def test_continue_final_message_goes_on_from_the_assistants_text(server, llm):
    """The assistant message left open: the same tokens as a completion of the template's text without
    the end of that turn."""
    tokenizer = llm.get_tokenizer()
    messages = [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "A good fruit is"}]
    status, chat = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 8, "temperature": 0,
                                                         "continue_final_message": True,
                                                         "add_generation_prompt": False})
    assert status == 200, chat
    text = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    completion = llm.generate(tokenizer.encode(text, add_special_tokens=False),
                              SamplingParams(temperature=0, max_tokens=8))[0].outputs[0].text
    assert chat["choices"][0]["message"]["content"] == completion


@pytest.mark.parametrize("body,param", [
    ({"use_beam_search": True, "stop": ["x"]}, "use_beam_search"),  # stop strings: not applied by beam search
    ({"priority": 3}, "priority"),  # without --scheduling-policy priority
    ({"continue_final_message": True}, "continue_final_message"),  # add_generation_prompt is true by default
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"bad_words": "Paris"}, "bad_words"),
])
def test_refusals_name_the_field(server, body, param):
    status, answer = post(server, "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
    assert status == 400 and answer["error"]["param"] == param, answer
    ok, _ = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                                  "use_beam_search": False, "priority": 0})
    assert ok == 200


def test_priority_scheduling_runs_the_most_urgent_request_first(default_source):
    """--scheduling-policy priority with one sequence at a time: requests given together run in priority
    order (lower first), not in the order they came."""
    from llmctl import LLM, SamplingParams

    llm = LLM(None, max_model_len=256, max_num_seqs=1, scheduling_policy="priority")
    priorities = [5, 0, 1]
    outputs = llm.generate(["a b c", "d e f", "g h i"], [SamplingParams(max_tokens=3, ignore_eos=True, priority=p)
                                                         for p in priorities])
    order = sorted(range(3), key=lambda i: outputs[i].metrics.first_scheduled_time)
    assert [priorities[i] for i in order] == [0, 1, 5]


def test_priority_without_the_policy_is_refused_by_name(server):
    status, answer = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "priority": 3})
    assert status == 400 and answer["error"]["param"] == "priority" and "--scheduling-policy priority" in \
        answer["error"]["message"]
    assert post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "priority": 0})[0] == 200
