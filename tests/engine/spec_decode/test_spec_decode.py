"""Speculative decoding: the n-gram proposer, the rejection sampler's distribution, and the
engine's output with speculation against the same engine without it."""

from __future__ import annotations

import json

import pytest
import torch

from llmctl import LLM, SamplingParams
from llmctl.engine.errors import EngineConfigError, SpeculativeConfigError
from llmctl.engine.sample.rejection import VerifyInput, accept_or_recover, verify
from llmctl.engine.spec_decode.config import SpeculativeConfig, parse_speculative_config
from llmctl.engine.spec_decode.ngram import propose_ngram
from llmctl.engine.spec_decode.proposal import Draft

pytestmark = pytest.mark.subprocess

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
REPEATING = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"
PROMPTS = [
    REPEATING,
    "Hello, my name is",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef",
]


# -- the n-gram proposer ---------------------------------------------------------------------
@pytest.mark.parametrize("tokens, min_n, max_n, k, expected", [
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),  # the case: [2, 3] recurs, 3 tokens follow it
    ([1, 2, 3, 4, 2, 3], 2, 3, 2, [4, 2]),  # at most k
    ([1, 2, 3, 4, 5], 1, 3, 4, []),  # no suffix recurs
    ([8, 9, 5, 7, 8, 9, 1, 7, 8, 9], 2, 3, 4, [1, 7, 8, 9]),  # the longest suffix wins over an earlier shorter one
    ([8, 9, 5, 7, 8, 9, 1, 7, 8, 9], 2, 2, 4, [5, 7, 8, 9]),  # of [8, 9]'s occurrences the earliest
    ([5, 6, 1, 5, 6, 2, 5, 6], 2, 2, 1, [1]),
    ([4], 1, 2, 3, []),
    ([1, 1, 1, 1], 1, 3, 2, [1]),  # a match that ends right before the suffix: one token follows
])
def test_ngram_proposer(tokens, min_n, max_n, k, expected):
    assert propose_ngram(tokens, min_n, max_n, k) == expected


# -- --speculative-config --------------------------------------------------------------------
def test_speculative_config_follows_vllms_keys_and_defaults():
    assert parse_speculative_config(None) is None and parse_speculative_config("{}") is None
    assert parse_speculative_config(NGRAM) == SpeculativeConfig("ngram", 4, 4, 2)
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}') == \
        SpeculativeConfig("ngram", 3, 5, 5)  # vLLM's defaults
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}) == \
        SpeculativeConfig("ngram", 3, 4, 4)
    assert parse_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 3}) == \
        SpeculativeConfig("ngram", 2, 3, 3)
    assert parse_speculative_config({"model": "org/draft", "num_speculative_tokens": 5}) == \
        SpeculativeConfig("draft_model", 5, model="org/draft")
    assert parse_speculative_config({**NGRAM, "disable_by_batch_size": 8}) == \
        SpeculativeConfig("ngram", 4, 4, 2, disable_by_batch_size=8)


@pytest.mark.parametrize("value, message", [
    ("{nope", "not valid JSON"),
    ('{"method": "ngram"}', "needs num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "between 1 and 16"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 2}',
     "prompt_lookup_min ≤ prompt_lookup_max"),
    ('{"method": "medusa", "num_speculative_tokens": 4}', "not supported"),
    ('{"method": "eagle", "num_speculative_tokens": 4}', 'method eagle needs "model"'),
    ('{"method": "draft_model", "num_speculative_tokens": 4}', 'needs "model"'),
    ('{"method": "ngram", "num_speculative_tokens": 4, "lookahead": 2}', "unknown key(s) lookahead"),
    ('{"num_speculative_tokens": 4}', 'needs "method"'),
    ('[1, 2]', "JSON object"),
    ('{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 0}', "at least 1"),
])
def test_bad_speculative_configs_name_the_problem(value, message):
    with pytest.raises(SpeculativeConfigError, match=None) as caught:
        parse_speculative_config(value)
    assert message in str(caught.value)


# -- the rejection sampler ---------------------------------------------------------------------
def _total_variation(tokens: torch.Tensor, target: torch.Tensor) -> float:
    empirical = torch.bincount(tokens, minlength=target.numel()).double() / tokens.numel()
    return 0.5 * float((empirical - target.double()).abs().sum())


def _rejection_sample(p: torch.Tensor, q: torch.Tensor | None, proposed: torch.Tensor, trials: int,
                      seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    target = p.expand(trials, -1).contiguous()
    draft = q.expand(trials, -1).contiguous() if q is not None else None
    accepted, recovered = accept_or_recover(target, draft, proposed, torch.rand(trials, generator=generator),
                                            torch.rand(trials, generator=generator))
    return torch.where(accepted, proposed, recovered)


P = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
Q = torch.tensor([0.40, 0.05, 0.25, 0.10, 0.00, 0.20])
TRIALS = 200_000
# With 6 outcomes and 200,000 draws the sampling error of the TV distance is about 0.002.
TV_BOUND = 0.01


def test_rejection_sampling_reproduces_the_target_distribution():
    proposed = torch.multinomial(Q, TRIALS, replacement=True, generator=torch.Generator().manual_seed(1))
    tokens = _rejection_sample(P, Q, proposed, TRIALS, seed=2)
    assert _total_variation(tokens, P) < TV_BOUND
    # The bound has power: accepting every proposal outputs q, and drawing the replacement from p
    # instead of normalize(max(0, p - q)) double-counts the accepted mass.
    assert _total_variation(proposed, P) > 10 * TV_BOUND
    generator = torch.Generator().manual_seed(3)
    accepted = torch.rand(TRIALS, generator=generator) * Q[proposed] < P[proposed]
    wrong = torch.where(accepted, proposed, torch.multinomial(P, TRIALS, replacement=True, generator=generator))
    assert _total_variation(wrong, P) > 5 * TV_BOUND


def test_ngram_style_proposals_including_always_wrong_ones_keep_the_target_distribution():
    for token in (1, 4):  # the target's most likely token, then a less likely one; q = 1 on each
        proposed = torch.full((TRIALS,), token)
        assert _total_variation(_rejection_sample(P, None, proposed, TRIALS, seed=token), P) < TV_BOUND
    impossible = P.clone()
    impossible[2] = 0.0
    impossible /= impossible.sum()
    tokens = _rejection_sample(impossible, None, torch.full((TRIALS,), 2), TRIALS, seed=7)
    assert (tokens != 2).all()  # a proposal the target gives no mass is always rejected
    assert _total_variation(tokens, impossible) < TV_BOUND


def test_greedy_verification_accepts_the_longest_agreeing_prefix_plus_one():
    vocab = 10
    logits = torch.full((8, vocab), -5.0)
    for row, best in enumerate([3, 7, 2, 9, 4, 4, 1, 6]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0)
    inputs = [VerifyInput(greedy, torch.Generator(), Draft([3, 7, 5]), first_row=0),  # third is wrong: 2 + the fix
              VerifyInput(greedy, torch.Generator(), Draft([4]), first_row=4),  # all right: + the bonus token
              VerifyInput(SamplingParams(temperature=0, logprobs=1), torch.Generator(), Draft([0]), first_row=6)]
    result = verify(logits[:6].clone(), inputs[:2]) + verify(logits, inputs[2:])
    assert [[t for t, _ in r] for r in result] == [[3, 7, 2], [4, 4], [1]]
    assert result[2][0][1].token_id == 1 and result[2][0][1].rank == 1


# -- the engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain(default_source):
    return LLM(None, max_model_len=256)


def _greedy(max_tokens: int = 24, **extra) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def _tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def reference(plain):
    return plain.generate(PROMPTS, _greedy(logprobs=1))


def test_ngram_speculation_is_token_identical_with_chunks_and_prefix_caching(reference):
    llm = LLM(None, max_model_len=256, max_num_batched_tokens=24, speculative_config=NGRAM)  # prompts chunked
    for _ in range(2):  # the second round finds every prompt in the prefix cache
        outputs = llm.generate(PROMPTS, _greedy(logprobs=1))
        assert _tokens(outputs) == _tokens(reference)
        for ours, theirs in zip(outputs, reference):
            diffs = [abs(a.logprob - b.logprob) for a, b in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs)]
            assert max(diffs) < 1e-4
    engine = llm.engine
    stats = engine.speculator.stats
    assert stats.num_drafts > 0 and 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
    assert sum(stats.accepted_per_position) == stats.num_accepted_tokens
    assert engine.block_manager.stats.hits > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # rejected tokens' blocks came back


def test_ngram_speculation_under_preemption(reference):
    # 8 blocks of 16 tokens: the four sequences (29 to 62 tokens, 12 blocks, plus proposals) do not fit at once.
    block_bytes = 16 * 30 * 2 * 3 * 64 * 4
    llm = LLM(None, max_model_len=128, kv_cache_memory=8 * block_bytes, speculative_config=NGRAM)
    assert _tokens(llm.generate(PROMPTS, _greedy())) == _tokens(reference)
    assert llm.engine.scheduler.num_preemptions > 0


def test_a_batch_mixes_speculating_and_plain_requests(plain):
    llm = LLM(None, max_model_len=256, speculative_config=NGRAM)
    params = [_greedy(), _greedy(repetition_penalty=1.3), _greedy(min_tokens=20), _greedy(8)]
    ours = llm.generate(PROMPTS, params)
    assert _tokens(ours) == _tokens(plain.generate(PROMPTS, params))
    assert [len(t) for t in _tokens(ours)] == [24, 24, 24, 8]  # max_tokens holds with several tokens per step


def test_requests_that_opt_out_and_full_batches_do_not_propose(plain):
    llm = LLM(None, max_model_len=256, speculative_config={**NGRAM, "disable_by_batch_size": 3})
    opted_out = _greedy(disable_spec_decode=True)
    assert _tokens(llm.generate([REPEATING], opted_out)) == _tokens(plain.generate([REPEATING], opted_out))
    assert llm.engine.speculator.stats.num_drafts == 0  # alone, and repeating itself, but opted out
    assert _tokens(llm.generate(PROMPTS, _greedy())) == _tokens(plain.generate(PROMPTS, _greedy()))
    assert llm.engine.speculator.stats.num_drafts == 0  # four running: at or above disable_by_batch_size
    mixed = [_greedy(), opted_out]
    assert _tokens(llm.generate([REPEATING] * 2, mixed)) == _tokens(plain.generate([REPEATING] * 2, mixed))
    assert llm.engine.speculator.stats.num_drafts > 0


def test_stop_strings_and_eos_end_a_speculative_step_early(plain):
    llm = LLM(None, max_model_len=256, speculative_config=NGRAM)
    params = [SamplingParams(temperature=0, max_tokens=40, stop=["lazy"]),
              SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[28]),
              SamplingParams(temperature=0, max_tokens=60)]
    prompts = [REPEATING, PROMPTS[2], PROMPTS[1]]
    for ours, theirs in zip(llm.generate(prompts, params), plain.generate(prompts, params)):
        assert (ours.outputs[0].text, ours.outputs[0].token_ids, ours.outputs[0].finish_reason,
                ours.outputs[0].stop_reason) == (theirs.outputs[0].text, theirs.outputs[0].token_ids,
                                                 theirs.outputs[0].finish_reason, theirs.outputs[0].stop_reason)


def test_seeded_sampling_with_speculation_is_reproducible():
    llm = LLM(None, max_model_len=256, speculative_config=NGRAM)
    params = [SamplingParams(temperature=0.7, seed=11, max_tokens=24), SamplingParams(temperature=1.0, seed=5,
                                                                                       top_p=0.9, max_tokens=24)]
    first = _tokens(llm.generate(PROMPTS[:2], params))
    again = _tokens(llm.generate(PROMPTS[:2][::-1], params[::-1]))[::-1]  # another batch order
    assert first == again
    assert llm.engine.speculator.stats.num_drafts > 0


def test_draft_model_speculation_is_token_identical(default_source, reference, tmp_path):
    # The model as its own draft accepts every proposal; a random draft of the same tokenizer accepts few.
    llm = LLM(None, max_model_len=256, max_num_batched_tokens=24,  # prompts chunked
              speculative_config={"model": str(default_source.path), "num_speculative_tokens": 3})
    for _ in range(2):  # the second round reads the prompts' K/V (target's and draft's) from the prefix cache
        assert _tokens(llm.generate(PROMPTS, _greedy())) == _tokens(reference)
    stats = llm.engine.speculator.stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    assert llm.engine.block_manager.stats.hits > 0

    random_draft = _random_llama(tmp_path / "draft", default_source)
    block_bytes = 16 * 30 * 2 * 3 * 64 * 4  # as in test_ngram_speculation_under_preemption: 8 blocks
    llm = LLM(None, max_model_len=128, kv_cache_memory=8 * block_bytes,
              speculative_config={"model": str(random_draft), "num_speculative_tokens": 3})
    assert _tokens(llm.generate(PROMPTS, _greedy())) == _tokens(reference)
    stats = llm.engine.speculator.stats
    assert stats.num_accepted_tokens < stats.num_draft_tokens / 4
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_draft_model_sampling_is_reproducible_and_samples(default_source, tmp_path):
    llm = LLM(None, max_model_len=256,
              speculative_config={"model": str(default_source.path), "num_speculative_tokens": 2})
    params = [SamplingParams(temperature=0.8, seed=3, max_tokens=20), SamplingParams(temperature=0.8, seed=4,
                                                                                      max_tokens=20)]
    first = _tokens(llm.generate(PROMPTS[:2], params))
    assert first == _tokens(llm.generate(PROMPTS[:2], params))
    assert first[0] != _tokens(llm.generate(PROMPTS[:1], [SamplingParams(temperature=0.8, seed=99, max_tokens=20)]))[0]


def _random_llama(folder, default_source):
    from transformers import AutoTokenizer, LlamaConfig

    from helpers.models import save_random_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return save_random_model(config, folder, tokenizer)


def test_drafts_that_cannot_work_and_sharded_targets_are_refused(default_source, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig

    from helpers.models import save_random_model

    def tiny(folder: str, tokenizer, **config) -> str:
        return str(save_random_model(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                 **config), tmp_path / folder, tokenizer))

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    short = tiny("short", tokenizer, max_position_embeddings=128)
    with pytest.raises(SpeculativeConfigError, match="context of 128 tokens.*--max-model-len 128 or less"):
        LLM(None, max_model_len=256, speculative_config={"model": short, "num_speculative_tokens": 2})
    tokenizer.add_tokens(["<an-extra-token>"])
    other = tiny("other", tokenizer)
    with pytest.raises(SpeculativeConfigError, match="different tokenizer"):
        LLM(None, max_model_len=128, speculative_config={"model": other, "num_speculative_tokens": 2})
    with pytest.raises(EngineConfigError, match="--tensor-parallel-size 1"):
        LLM(None, tensor_parallel_size=3, speculative_config=NGRAM)


# -- the server ----------------------------------------------------------------------------------
def test_served_streams_with_speculation_equal_the_plain_engine_and_count_acceptance(plain, tmp_path):
    import openai

    from helpers.cli_process import run_cli
    from helpers.server_helpers import metrics, start_server

    server = start_server("--max-model-len", "256", "--speculative-config", json.dumps(NGRAM))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
        before = metrics(server)
        expected = plain.generate([REPEATING], _greedy(32))[0].outputs[0]
        stream = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=32, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = [chunk.choices[0].text for chunk in stream]
        assert "".join(chunks) == expected.text
        assert len([c for c in chunks if c]) < 32  # several accepted tokens arrive in one chunk
        after = metrics(server)
        for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos"):
            key = f"llmctl:spec_decode_{name}_total"
            assert after[key] > before.get(key, 0), key
        assert after["llmctl:generation_tokens_total"] - before["llmctl:generation_tokens_total"] == 32
        opted_out = client.completions.create(model=MODEL, prompt=REPEATING, max_tokens=32, temperature=0,
                                              extra_body={"ignore_eos": True, "disable_spec_decode": True})
        assert opted_out.choices[0].text == expected.text
        assert metrics(server)["llmctl:spec_decode_num_drafts_total"] == after["llmctl:spec_decode_num_drafts_total"]

        out = tmp_path / "bench.json"  # bench serve reads the acceptance from the counters
        result = run_cli("bench", "serve", "--base-url", server.url, "--num-prompts", "4", "--random-input-len",
                         "24", "--random-output-len", "16", "--ignore-eos", "--temperature", "0",
                         "--result-filename", str(out))
        assert result.returncode == 0, result.stdout + result.stderr
        spec = json.loads(out.read_text())["server_metrics"]["spec_decode"]
        assert spec["num_drafts"] > 0 and spec["num_draft_tokens"] >= spec["num_accepted_tokens"]
        assert "Mean acceptance length" in result.stdout
    finally:
        server.stop()


def test_structured_outputs_with_speculation_follow_the_grammar_token_for_token(plain, default_source):
    """Drafts are checked against the grammar (cut at the first token it refuses, each row verified under
    its mask, the matcher rolled back): the tokens are those of the same grammar without speculation.
    With the model as its own draft every proposal the grammar allows is accepted."""
    from llmctl.engine.structured.params import StructuredOutputsParams

    schema = {"type": "object", "properties": {"items": {"type": "array", "maxItems": 6, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "maximum": 99}, "tag": {"enum": ["x", "y"]}},
        "required": ["id", "tag"], "additionalProperties": False}}}, "required": ["items"],
        "additionalProperties": False}
    specs = [StructuredOutputsParams(json=schema), StructuredOutputsParams(regex=r"(ab ){3,12}c"),
             StructuredOutputsParams(choice=("the quick brown fox", "the lazy dog"))]
    params = [SamplingParams(temperature=0, max_tokens=120, structured_outputs=spec) for spec in specs]
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[0]]
    expected = _tokens(plain.generate(prompts, params))
    for config in (NGRAM, {"model": str(default_source.path), "num_speculative_tokens": 3}):
        llm = LLM(None, max_model_len=256, speculative_config=config)
        assert _tokens(llm.generate(prompts, params)) == expected
        stats = llm.engine.speculator.stats
        assert stats.num_accepted_tokens > 0, config
        llm.shutdown()


def test_requests_with_biases_or_word_lists_do_not_speculate(plain):
    llm = LLM(None, max_model_len=256, speculative_config=NGRAM)
    params = [_greedy(logit_bias={13: 2.0}), _greedy(bad_words=["fox"]), _greedy(allowed_token_ids=list(range(900)))]
    assert _tokens(llm.generate([REPEATING] * 3, params)) == _tokens(plain.generate([REPEATING] * 3, params))
    assert llm.engine.speculator.stats.num_drafts == 0


def test_the_target_sets_aside_what_its_draft_will_take(default_source, tmp_path):
    """On a GPU the target sizes its pool first: the draft's weights and its KV per block are kept out of it,
    counted from the draft's config. Checked here against the draft as it really loads (CPU, float32)."""
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.spec_decode.draft_memory import draft_reservation
    from llmctl.engine.worker.memory_reservation import MemoryReservation

    draft = _random_llama(tmp_path / "draft", default_source)
    spec_config = {"model": str(draft), "num_speculative_tokens": 2}
    config = EngineConfig(speculative_config=spec_config)
    config.validate()
    reserved = draft_reservation(config, torch.float32, torch.float32)
    llm = LLM(str(default_source.path), max_model_len=256, speculative_config=spec_config)
    loaded = llm.engine.speculator.draft_model.loaded
    assert reserved.fixed_bytes == loaded.weights_bytes
    assert reserved.bytes_per_block == loaded.kv_geometry.block_bytes
    # 100 target blocks of 1,000 bytes and 250 draft bytes each, beside 5,000 bytes of draft weights
    assert MemoryReservation("draft", 5_000, 250).kv_bytes_beside(130_000, 1_000) == 100_000
    assert MemoryReservation().kv_bytes_beside(130_000, 1_000) == 130_000
    ngram = EngineConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    ngram.validate()
    assert draft_reservation(ngram, torch.float32, torch.float32) == MemoryReservation()
