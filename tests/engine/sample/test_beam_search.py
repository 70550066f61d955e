"""Beam search (vLLM's, above the engine) against transformers' beam search on the default model: the
same beams in the same order, with the same cumulative log-probabilities; vLLM's length-penalty score and
EOS handling on the pure algorithm; and `use_beam_search` through the server with the openai client."""

from __future__ import annotations

import pytest
import torch

from helpers.server_helpers import post
from llmctl import LLM
from llmctl.engine.front.beam_search import Beam, BeamSearch, BeamSearchParams

PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]


def test_beams_match_transformers(default_source):
    from transformers import AutoModelForCausalLM

    llm = LLM(None, max_model_len=256)
    params = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
    outputs = llm.beam_search(PROMPTS, params)
    hf = AutoModelForCausalLM.from_pretrained(str(default_source.path), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # no beam ends early: ignore_eos
    for prompt, output in zip(PROMPTS, outputs):
        ids = torch.tensor([output.prompt_token_ids])
        assert output.prompt_token_ids == llm.get_tokenizer().encode(prompt)
        with torch.no_grad():
            ref = hf.generate(ids, num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=6,
                              length_penalty=1.0, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        assert [beam.token_ids for beam in output.outputs] == [row[ids.shape[1]:].tolist() for row in ref.sequences]
        # transformers' sequences_scores: sum of logprobs / generated length (all beams here have 6 tokens)
        ours = [beam.cumulative_logprob for beam in output.outputs]
        assert ours == pytest.approx([float(s) * 6 for s in ref.sequences_scores], abs=2e-3)
        assert all(beam.finish_reason == "length" and beam.text for beam in output.outputs)


def test_the_score_and_eos_as_vllm_has_them():
    eos = 9
    search = BeamSearch([1, 2], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=2.0), eos)
    search.advance([{5: -0.1, eos: -0.2, 6: -3.0}])
    assert [b.tokens for b in search.beams] == [[1, 2, 5], [1, 2, 6]] and search.completed[0].finish_reason == "stop"
    # vLLM's get_beam_search_score: the prompt counts in the length, a final EOS does not
    assert Beam([1, 2, 5], -0.9).score(eos, 2.0) == pytest.approx(-0.9 / 9)
    assert Beam([1, 2, 5, eos], -0.9).score(eos, 2.0) == pytest.approx(-0.9 / 9)
    search.advance([{7: -5.0}, {8: -5.0}])
    # completed -0.2 / 2² = -0.05 ranks above the live -5.1 / 4² and -8 / 4²
    assert [beam.tokens for beam in search.best()] == [[1, 2, eos], [1, 2, 5, 7]]


def test_use_beam_search_through_the_server(server, client, default_source):
    """The served beams are the offline engine's (which match transformers, above), streamed or not."""
    model = client.models.list().data[0].id
    request = dict(model=model, prompt=PROMPTS[0], n=3, max_tokens=5, temperature=0,
                   extra_body={"use_beam_search": True, "ignore_eos": True})
    served = [c.text for c in sorted(client.completions.create(**request).choices, key=lambda c: c.index)]
    streamed = {}
    for chunk in client.completions.create(stream=True, **request):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    offline = LLM(None, max_model_len=256).beam_search([PROMPTS[0]], BeamSearchParams(3, 5, ignore_eos=True))
    assert served == [beam.text for beam in offline[0].outputs] == [streamed[i] for i in range(3)]
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
                                          extra_body={"use_beam_search": True})
    assert len(chat.choices) == 2 and all(choice.message.content is not None for choice in chat.choices)


@pytest.mark.parametrize("extra,words", [({"stop": ["x"]}, "stop"), ({"logprobs": 1}, "logprobs"),
                                         ({"n": 11}, "at most 10"),
                                         ({"structured_outputs": {"choice": ["a"]}}, "structured outputs"),
                                         *[({name: value}, name) for name, value in (
                                             ("bad_words", ["x"]), ("allowed_token_ids", [1, 2]), ("min_tokens", 2),
                                             ("stop_token_ids", [2]), ("repetition_penalty", 1.2), ("top_k", 5),
                                             ("seed", 3), ("priority", 1), ("prompt_logprobs", 1), ("top_p", 0.5),
                                             ("min_p", 0.1), ("presence_penalty", 0.5))]])
def test_what_beam_search_does_not_apply_is_refused(server, extra, words):
    status, answer = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "use_beam_search": True, **extra})
    assert status == 400 and words in answer["error"]["message"], answer
