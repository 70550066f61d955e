"""The engine against transformers on the same weights: greedy tokens identical, logprobs close."""

from __future__ import annotations

import pytest
import torch

from llmctl import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "What is 2+2?",
    "Translate to French: I like apples.",
    "List three primary colors:",
    "The quick brown fox",
    "In 1492, Columbus",
]
MAX_TOKENS = 32
# min_tokens blocks EOS exactly as transformers' min_new_tokens does, so both run the full 32 tokens.
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, logprobs=0)


@pytest.fixture(scope="module")
def hf_model(default_source):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(default_source.path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(default_source):
    return LLM(str(default_source.path), max_model_len=1024)


@pytest.fixture(scope="module")
def reference(hf_model, engine):
    """transformers greedy continuation and the log-probability of each chosen token."""
    tokenizer = engine.get_tokenizer()
    result = {}
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf_model.generate(ids, do_sample=False, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                    output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        logprobs = [float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, tokens)]
        result[prompt] = (tokens, logprobs)
    return result


def assert_matches(outputs, reference):
    for prompt, output in zip(PROMPTS, outputs):
        tokens, logprobs = reference[prompt]
        completion = output.outputs[0]
        assert completion.token_ids == tokens, prompt
        ours = [lp.logprob for lp in completion.logprobs]
        assert max(abs(a - b) for a, b in zip(ours, logprobs)) < 1e-3, prompt


def test_one_at_a_time(engine, reference):
    assert_matches([engine.generate(p, GREEDY)[0] for p in PROMPTS], reference)


def test_all_together(engine, reference):
    assert_matches(engine.generate(PROMPTS, GREEDY), reference)


def test_tiny_token_budget_chunks_every_prompt(default_source, reference):
    llm = LLM(str(default_source.path), max_model_len=1024, max_num_batched_tokens=4)
    scheduled = []
    original = llm.engine.scheduler.schedule

    def spy(lane=0):
        out = original(lane)
        scheduled.append(out.num_tokens)
        return out

    llm.engine.scheduler.schedule = spy
    assert_matches(llm.generate(PROMPTS, GREEDY), reference)
    assert max(scheduled) <= 4


def test_without_chunked_prefill_every_prompt_runs_whole(default_source, reference):
    """vLLM's --no-enable-chunked-prefill: each step computes whole prompts (its budget one max_model_len, as
    vLLM sets it), tokens identical; a smaller --max-num-batched-tokens is refused at startup."""
    from llmctl.engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match="--max-num-batched-tokens 16 is less than --max-model-len 64"):
        LLM(str(default_source.path), max_model_len=64, max_num_batched_tokens=16, enable_chunked_prefill=False)
    assert LLM(str(default_source.path), max_model_len=64, enable_chunked_prefill=False,
               kv_cache_memory=1 << 22).engine.loaded.max_num_batched_tokens == 2048  # max(CPU default, max_model_len)
    # the prompts' 57 tokens overrun a 48-token step: chunked, the 7th prompt would get its first 3 tokens
    llm = LLM(str(default_source.path), max_model_len=48, max_num_batched_tokens=48, enable_chunked_prefill=False)
    prefills = []
    original = llm.engine.scheduler.schedule

    def spy(lane=0):
        out = original(lane)
        prefills.extend((x.seq.num_computed_tokens, x.num_new_tokens, len(x.seq.prompt_token_ids))
                        for x in out.scheduled if x.seq.num_computed_tokens == 0)
        return out

    llm.engine.scheduler.schedule = spy
    assert_matches(llm.generate(PROMPTS, GREEDY), reference)
    assert len(prefills) == len(PROMPTS) and all(new == prompt for _, new, prompt in prefills)


def test_preemption_under_a_small_kv_pool(default_source, reference):
    block_bytes = 16 * 2 * 30 * 3 * 64 * 4  # SmolLM2, float32
    llm = LLM(str(default_source.path), max_model_len=64, kv_cache_memory=12 * block_bytes)
    assert llm.engine.block_manager.num_blocks == 12
    assert_matches(llm.generate(PROMPTS, GREEDY), reference)
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.num_free_blocks == 12  # everything freed at the end


def test_shared_system_prompt_hits_the_prefix_cache(default_source, hf_model, engine):
    system = ("You are a careful assistant. Answer in one short sentence, without lists, and never "
              "invent facts you do not know. ") * 2
    prompts = [system + q for q in ("Where is Paris?", "What is water made of?", "Who wrote Hamlet?")]
    llm = LLM(str(default_source.path), max_model_len=1024)
    stats = llm.engine.block_manager.stats
    first = llm.generate(prompts[0], GREEDY)[0]
    rest = llm.generate(prompts[1:], GREEDY)
    assert stats.hits >= 2 * 32  # the system prompt spans several full blocks, reused by both
    assert all(o.num_cached_tokens > 0 for o in rest)
    tokenizer = engine.get_tokenizer()
    for prompt, output in zip(prompts, [first, *rest]):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        ref = hf_model.generate(ids, do_sample=False, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                pad_token_id=0)[0, ids.shape[1]:].tolist()
        assert output.outputs[0].token_ids == ref


def test_prompt_logprobs_match_transformers(engine, hf_model):
    prompt = "The capital of France is Paris, and the capital of Italy is"
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    output = engine.generate(prompt, params)[0]
    ids = output.prompt_token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    assert output.prompt_logprobs[0] is None
    for position in range(1, len(ids)):
        entry = output.prompt_logprobs[position]
        assert entry.token_id == ids[position]
        assert abs(entry.logprob - float(ref[position - 1, ids[position]])) < 1e-3
        assert len(entry.top) == 2


def test_repetition_penalty_matches_transformers(engine, hf_model):
    prompt = "Repeat after me: la la la la"
    ids = engine.get_tokenizer()(prompt, return_tensors="pt").input_ids
    ref = hf_model.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16, repetition_penalty=1.3,
                            pad_token_id=0)[0, ids.shape[1]:].tolist()
    params = SamplingParams(temperature=0, max_tokens=16, min_tokens=16, repetition_penalty=1.3)
    assert engine.generate(prompt, params)[0].outputs[0].token_ids == ref
