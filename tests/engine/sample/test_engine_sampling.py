"""Sampling settings, stop conditions, n > 1, logprobs, detokenization and startup errors."""

from __future__ import annotations

import os

import pytest
import torch

from llmctl import LLM, SamplingParams
from llmctl.engine.core.sequence import Sequence
from llmctl.engine.core.step_messages import SampleInput
from llmctl.engine.errors import EngineConfigError, InvalidRequestError
from llmctl.engine.front.detokenizer import IncrementalDetokenizer
from llmctl.engine.sample.sampler import CDF_CHUNK, inverse_cdf, sample

PROMPT = "The capital of France is"  # greedy: " Paris.\n\nThe answer is: ..."


@pytest.fixture(scope="module")
def llm(default_source):
    return LLM(str(default_source.path), max_model_len=512)


def greedy(**overrides) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": 16, **overrides})


def test_seeded_output_does_not_depend_on_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate(PROMPT, seeded)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True) for _ in range(3)]
    batch = llm.generate(["Hello", PROMPT, "Write a poem", "1 2 3"], [others[0], seeded, others[1], others[2]])
    assert batch[1].outputs[0].token_ids == alone
    unseeded = llm.generate(PROMPT, SamplingParams(temperature=1.0, seed=99, max_tokens=24, ignore_eos=True))
    assert unseeded[0].outputs[0].token_ids != alone


def test_top_k_1_and_min_p_1_are_greedy(llm):
    reference = llm.generate(PROMPT, greedy(ignore_eos=True))[0].outputs[0].token_ids
    for params in (SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True),
                   SamplingParams(temperature=0.8, min_p=1.0, max_tokens=16, ignore_eos=True),
                   SamplingParams(temperature=0.8, top_p=1e-6, max_tokens=16, ignore_eos=True)):
        assert llm.generate(PROMPT, params)[0].outputs[0].token_ids == reference


def test_stop_string_is_cut_from_the_text(llm):
    out = llm.generate(PROMPT, greedy(stop=["\n"]))[0].outputs[0]
    assert out.text == " Paris." and out.finish_reason == "stop" and out.stop_reason == "\n"
    kept = llm.generate(PROMPT, greedy(stop=["\n"], include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == " Paris.\n"
    multi = llm.generate(PROMPT, greedy(stop=["ris."]))[0].outputs[0]  # spans two tokens
    assert multi.text == " Pa" and multi.stop_reason == "ris."


def test_stop_token_ids_eos_and_ignore_eos(llm):
    period = llm.get_tokenizer().encode(".")[0]
    out = llm.generate(PROMPT, greedy(stop_token_ids=[period]))[0].outputs[0]
    assert out.token_ids[-1] == period and out.finish_reason == "stop" and out.stop_reason == period
    eos = llm.generate("What is 2+2?", greedy())[0].outputs[0]  # this model ends at once
    assert eos.token_ids == [2] and eos.finish_reason == "stop" and eos.text == ""
    assert llm.engine.loaded.eos_token_ids == [2]
    ignored = llm.generate("What is 2+2?", greedy(ignore_eos=True, max_tokens=5))[0].outputs[0]
    assert len(ignored.token_ids) == 5 and ignored.finish_reason == "length"


def test_min_tokens_and_max_tokens(llm):
    out = llm.generate("What is 2+2?", greedy(min_tokens=4, max_tokens=8))[0].outputs[0]
    assert len(out.token_ids) >= 4 and 2 not in out.token_ids[:4]
    assert llm.generate(PROMPT, greedy(max_tokens=3, ignore_eos=True))[0].outputs[0].finish_reason == "length"


def test_n_completions_share_the_prompt_blocks(llm):
    engine = llm.engine
    prompt = "Write a long story about a dragon who learns to bake bread in a small town"
    engine.add_request("fork", prompt, SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True))
    while engine.output_processor.requests["fork"].seqs[0].waiting_to_fork:
        engine.step()
    seqs = engine.output_processor.requests["fork"].seqs
    assert len(seqs) == 3
    first_block = seqs[0].block_table[0]
    assert all(s.block_table[0] == first_block for s in seqs)
    assert engine.block_manager.blocks[first_block].ref_count == 3
    outputs = []
    while engine.has_unfinished_requests:
        outputs += [o for o in engine.step() if o.finished]
    completions = outputs[0].outputs
    assert [c.index for c in completions] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in completions}) > 1  # different samples
    both = llm.generate(prompt, SamplingParams(n=2, temperature=0, max_tokens=12, ignore_eos=True))[0]
    alone = llm.generate(prompt, greedy(max_tokens=12, ignore_eos=True))[0].outputs[0]
    assert both.outputs[0].token_ids == both.outputs[1].token_ids == alone.token_ids  # CoW kept both correct
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_siblings_go_on_when_the_first_completion_ends_at_its_first_token(llm):
    """n > 1 forks at the first token. When completion 0 ends right there (EOS), its siblings keep the
    prompt's blocks and run on; each completion i of a seeded request draws from seed + i, so it equals
    a lone request seeded with seed + i (vLLM's per-choice seeds)."""
    prompt = "What is 2+2?"  # this model mostly answers EOS at once
    out = llm.generate(prompt, SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6))[0].outputs
    assert out[0].token_ids == [2] and out[0].finish_reason == "stop"  # the case under test: the first ends at once
    alone = llm.generate(prompt, SamplingParams(temperature=1.0, seed=4, max_tokens=6))[0].outputs[0]
    assert len(alone.token_ids) > 1 and out[1].token_ids == alone.token_ids
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_logprobs_with_alternatives(llm):
    out = llm.generate(PROMPT, greedy(logprobs=3, max_tokens=4))[0].outputs[0]
    assert len(out.logprobs) == 4
    for token, entry in zip(out.token_ids, out.logprobs):
        assert entry.token_id == token and entry.rank == 1  # greedy picks the most likely
        assert len(entry.top) == 3 and max(entry.top.values()) == pytest.approx(entry.logprob)
    assert out.cumulative_logprob == pytest.approx(sum(e.logprob for e in out.logprobs))


def test_penalties_on_a_known_row():
    seq = Sequence(0, "r", 0, [1, 2], SamplingParams(temperature=0))
    seq.output_token_ids = [3, 3, 4]
    logits = torch.tensor([[0.0, 2.0, -2.0, 1.0, 1.0, 0.5]])
    params = SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    [(token, _)] = sample(logits, [SampleInput.for_sequence(seq, params, torch.Generator(), [])])
    # token 1: 2/2 = 1.0; 2: -2*2 = -4; 3: 1/2 - 0.5 - 0.5 = -0.5; 4: 1/2 - 0.5 - 0.25 = -0.25; 5: 0.5
    assert token == 1
    [(token, _)] = sample(logits, [SampleInput.for_sequence(seq, params, torch.Generator(), [1])])
    assert token == 5


@pytest.mark.parametrize("temperature", [0.0, 1e-5, 0.7])
def test_extreme_penalties_sample_the_limit_instead_of_failing(temperature):
    """A repetition penalty of 5e-324 (valid: > 0) overflows the seen positive logits to +inf; the draw
    then goes to them, as the limit says, and a row where every token is blocked still yields an id."""
    seq = Sequence(0, "r", 0, [1, 2], SamplingParams())
    logits = torch.tensor([[0.0, 2.0, -2.0, 1.0, float("-inf"), 0.5] + [0.1] * (2 * CDF_CHUNK)])
    params = SamplingParams(temperature=temperature, repetition_penalty=5e-324, seed=1)
    for _ in range(20):
        [(token, _)] = sample(logits, [SampleInput.for_sequence(seq, params, torch.Generator().manual_seed(_), [4])])
        assert token == 1  # 2 / 5e-324 beats everything; -2 * 5e-324 and the blocked -inf do not
    blocked = list(range(logits.shape[1]))
    [(token, _)] = sample(logits, [SampleInput.for_sequence(seq, params, torch.Generator(), blocked)])
    assert 0 <= token < logits.shape[1]


@pytest.mark.parametrize("vocab", [5, 3 * CDF_CHUNK + 44])  # one partial chunk; several and a padded tail
def test_inverse_cdf_draws_each_token_with_its_probability(vocab):
    torch.manual_seed(vocab)
    probs = torch.rand(vocab) ** 4
    probs[::3] = 0.0  # never drawn
    draws = 200_000
    tokens = inverse_cdf((probs / probs.sum()).expand(draws, vocab).contiguous(), torch.rand(draws))
    assert (probs[tokens] > 0).all()
    frequencies = torch.bincount(tokens, minlength=vocab).double() / draws
    expected = (probs / probs.sum()).double()
    # five standard deviations of a binomial frequency
    assert ((frequencies - expected).abs() <= 5 * (expected * (1 - expected) / draws).sqrt() + 1e-6).all()


def test_inverse_cdf_never_steps_past_the_last_token_with_mass():
    probs = torch.zeros(3, 2 * CDF_CHUNK)
    probs[:, 7] = 1.0
    probs[2, CDF_CHUNK + 3] = 1e-30  # a mass that vanishes in the float sums
    uniforms = torch.tensor([0.0, 1.0 - 2**-24, 1.0 - 2**-24])
    assert inverse_cdf(probs, uniforms).tolist()[:2] == [7, 7]
    assert inverse_cdf(probs, uniforms)[2].item() in (7, CDF_CHUNK + 3)


def test_incremental_detokenization_of_multibyte_text(llm):
    tokenizer = llm.get_tokenizer()
    text = "héllo 世界 🎉 naïve"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=tokenizer.encode("Say:"))
    deltas = [detok.add(ids[: i + 1]) for i in range(len(ids))]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_streamed_text_grows_monotonically(llm):
    engine = llm.engine
    engine.add_request("stream", PROMPT, greedy(max_tokens=12, ignore_eos=True, stop=["answer is"]))
    texts = []
    while engine.has_unfinished_requests:
        for output in engine.step():
            texts.append(output.outputs[0].text)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == " Paris.\n\nThe "  # the stop string never showed up in a partial text
    assert not any("answer" in t for t in texts)


def test_bad_requests_name_the_parameter(llm):
    with pytest.raises(InvalidRequestError, match="temperature") as info:
        SamplingParams(temperature=-1)
    assert info.value.param == "temperature"
    with pytest.raises(InvalidRequestError, match="n must be between 1 and 128"):
        SamplingParams(n=0)
    with pytest.raises(InvalidRequestError, match="the prompt has 600 tokens; this model's maximum context length "
                                                  "is 512"):
        llm.generate([5] * 600, greedy())
    with pytest.raises(InvalidRequestError, match="use max_tokens ≤ 502"):
        llm.generate([5] * 10, greedy(max_tokens=600))
    with pytest.raises(InvalidRequestError, match="prompt token ids must be in"):
        llm.generate([10**6], greedy())
    assert not llm.engine.has_unfinished_requests


def test_startup_errors_say_what_works(default_source):
    with pytest.raises(EngineConfigError, match="--max-model-len 100000 is longer than the model's context "
                                                "\\(8192.*use --max-model-len 8192"):
        LLM(str(default_source.path), max_model_len=100_000)
    from transformers import AutoConfig

    # the KV bytes of a token from transformers' config alone: K and V, every layer, every KV head, float32
    hf = AutoConfig.from_pretrained(str(default_source.path))
    head_dim = hf.hidden_size // hf.num_attention_heads
    per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * head_dim * 4
    memory = 8 * 1024 * 1024
    fits = memory // (16 * per_token) * 16  # whole 16-token blocks
    one_sequence = 8192 * per_token / 2**30
    expected = (rf"max_model_len 8192 needs {one_sequence:.2f} GiB of KV cache for one sequence; 0\.01 GiB is "
                rf"available: use --max-model-len {fits} or more memory \(--kv-cache-memory-bytes\)")
    with pytest.raises(EngineConfigError, match=expected):
        LLM(str(default_source.path), kv_cache_memory=memory)
    with pytest.raises(EngineConfigError, match="--block-size 12 is not supported"):
        LLM(str(default_source.path), block_size=12)


def test_kv_bytes_equal_the_plan(llm):
    from llmctl.plan.gpus import GpuType
    from llmctl.plan.planner import MeasuredMemory, PlanRequest, build_plan

    loaded = llm.engine.loaded
    # the CPU pool's size: vLLM's VLLM_CPU_KVCACHE_SPACE, which the suite sets (conftest), planned as a "GPU"
    # whose memory is all KV
    budget = int(float(os.environ["VLLM_CPU_KVCACHE_SPACE"]) * 1024**3)
    cpu = GpuType("cpu", "CPU", budget, "none", fp8=False)
    plan = build_plan(loaded.spec, PlanRequest(gpu=cpu, gpus=1, dtype="float32", gpu_memory_utilization=1.0,
                                               max_model_len=512), "m",
                      MeasuredMemory(weights_bytes=0, activation_bytes=0, overhead_bytes=0))
    assert loaded.kv_cache_bytes == plan.recommended.kv_blocks * 16 * plan.recommended.stages[0].kv_bytes_per_token
    assert loaded.kv_pool.num_blocks == plan.recommended.kv_blocks
    # on CPUs every layer's cache is a view of one buffer on 2 MiB pages (llmctl.kernels.huge_pages)
    caches = list(loaded.kv_caches.values())
    assert len({c.kv.untyped_storage().data_ptr() for c in caches}) == 1


def test_generation_config_defaults_apply_unless_overridden():
    defaults = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    filled = SamplingParams(max_tokens=4).with_defaults(defaults)
    assert (filled.temperature, filled.top_p, filled.top_k, filled.repetition_penalty) == (0.7, 0.8, 20, 1.05)
    explicit = SamplingParams(temperature=0.2, top_p=1.0, top_k=0, repetition_penalty=1.0).with_defaults(defaults)
    assert (explicit.temperature, explicit.top_p, explicit.top_k, explicit.repetition_penalty) == (0.2, 1.0, 0, 1.0)
    assert SamplingParams().with_defaults({"do_sample": False}).greedy
    assert SamplingParams().with_defaults({}).temperature == 1.0


def test_prompts_in_vllms_dict_forms(llm):
    """vLLM's LLM.generate takes TextPrompt and TokensPrompt dicts; each runs as its plain form does."""
    ids = llm.get_tokenizer()(PROMPT).input_ids
    plain = llm.generate(PROMPT, greedy())[0].outputs[0].token_ids
    for prompt in ({"prompt": PROMPT}, {"prompt_token_ids": ids}):
        [single] = llm.generate(prompt, greedy())
        assert single.prompt_token_ids == ids and single.outputs[0].token_ids == plain
    batch = llm.generate([{"prompt_token_ids": ids}, {"prompt": PROMPT}], greedy())
    assert [out.outputs[0].token_ids for out in batch] == [plain, plain]
    with pytest.raises(ValueError, match="exactly one of 'prompt'.*got the keys \\['text'\\]"):
        llm.generate({"text": PROMPT}, greedy())
