"""Async scheduling (--async-scheduling, llmctl.engine.executor.overlap): the same outputs as scheduling one step at
a time — across families, stops, seeds, structured outputs, preemption, LoRA and speculative decoding — while
steps really are submitted ahead of the one running. TP 2 with it: tests/engine/executor/test_parallel.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.models import random_model
from llmctl import LLM, SamplingParams

PROMPTS = ["The capital of France is", "Hello, my name is", [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
           "Once upon a time, in a land far away, there lived a king who had three daughters"]
MIXED = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2),
         SamplingParams(temperature=0, max_tokens=17, stop=["e"], min_tokens=3),  # a stop string ends it early
         SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=20, ignore_eos=True),  # seeded draws
         SamplingParams(temperature=0, max_tokens=30, min_tokens=25, stop_token_ids=[7, 9, 11])]


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer) -> dict[str, Path]:
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config

    tmp = tmp_path_factory.mktemp("async")
    vocab = len(tokenizer)
    shape = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    return {
        "llama": random_model(LlamaConfig(**shape), tmp / "llama", tokenizer),
        "qwen3": random_model(Qwen3Config(**shape, head_dim=16), tmp / "qwen3", tokenizer),
        "gemma3": random_model(Gemma3TextConfig(**shape, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                                layer_types=["sliding_attention", "full_attention"]),
                               tmp / "gemma3", tokenizer),
    }


def outputs(folder: Path, params, prompts=PROMPTS, **engine) -> tuple[list, LLM]:
    engine = {"max_model_len": 256, "kv_cache_memory": 32 << 20, **engine}
    llm = LLM(str(folder), **engine)
    try:
        got = llm.generate(prompts, params)
    finally:
        llm.shutdown()
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason,
             [lp.logprob for lp in o.outputs[0].logprobs or []]) for o in got], llm


def assert_same(ahead: list, waited: list) -> None:
    """Tokens, text and finish reasons identical; logprobs within float32 rounding: which steps go ahead depends on
    timing, so a step's rows may be batched differently, and a GEMM may sum a row in another order at another row
    count (oneDNN's, on CPUs where it is measured faster at some sizes)."""
    assert [o[:3] for o in ahead] == [o[:3] for o in waited]
    for (*_, ours), (*_, theirs) in zip(ahead, waited):
        assert len(ours) == len(theirs) and all(abs(a - b) < 1e-5 for a, b in zip(ours, theirs))


def both(folder: Path, params, prompts=PROMPTS, **engine) -> tuple[list, list, LLM]:
    waited, _ = outputs(folder, params, prompts, **dict(engine))
    ahead, llm = outputs(folder, params, prompts, async_scheduling=True, **engine)
    return waited, ahead, llm


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3"])
def test_the_same_outputs_with_steps_scheduled_ahead(models, family, monkeypatch):
    from llmctl.engine.worker.model_runner import ModelRunner

    on_device = []  # placeholders filled from the step before's tokens still on the device (the local executor)
    fill = ModelRunner._fill_placeholders
    monkeypatch.setattr(ModelRunner, "_fill_placeholders", lambda self, batch, ids: on_device.append(
        bool(batch.placeholders) and self.previous_tokens is not None) or fill(self, batch, ids))
    waited, ahead, llm = both(models[family], MIXED)
    assert_same(ahead, waited)
    assert llm.engine.steps_ahead > 20  # most decode steps went in while the one before still ran
    assert sum(on_device) >= llm.engine.steps_ahead - 1
    assert any(reason == "stop" for _, _, reason, _ in ahead)  # a stop with a step already in flight after it


def test_preempted_sequences_come_back_the_same(models):
    """A cache of 10 blocks (of 8 KiB: 16 tokens × K and V × 2 heads × 16 × 4 bytes × 2 layers) for four sequences
    of 3-4 blocks each: the steps scheduled without tokens ahead preempt."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    waited, ahead, llm = both(models["llama"], params, max_model_len=128, kv_cache_memory=10 * 8192)
    assert_same(ahead, waited)
    assert llm.engine.scheduler.num_preemptions > 0 and llm.engine.steps_ahead > 0


def test_structured_outputs_and_penalties_wait_for_their_tokens(models):
    from llmctl.engine.structured.params import StructuredOutputsParams

    params = [SamplingParams(temperature=0, max_tokens=20, structured_outputs=StructuredOutputsParams(
                  choice=["yes", "no", "maybe later"])),
              SamplingParams(temperature=0, max_tokens=20, repetition_penalty=1.5, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=20, bad_words=["the"], ignore_eos=True)]
    waited, ahead, _ = both(models["llama"], params)
    assert_same(ahead, waited)
    assert ahead[0][1] in ("yes", "no", "maybe later")


def test_speculative_decoding_and_lora_give_the_same_outputs(models, tmp_path):
    from helpers.lora_helpers import make_adapter
    from llmctl.engine.lora.request import LoRARequest

    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    waited, ahead, _ = both(models["llama"], params, speculative_config=ngram)
    assert_same(ahead, waited)
    adapter = make_adapter(models["llama"], tmp_path / "adapter", rank=4, targets=["q_proj", "v_proj", "down_proj"],
                           seed=1)
    lora = LoRARequest("a", 1, str(adapter))
    llms = {}
    for overlap in (False, True):
        llm = LLM(str(models["llama"]), max_model_len=256, kv_cache_memory=32 << 20, enable_lora=True,
                  async_scheduling=overlap)
        try:
            got = llm.generate(PROMPTS, params, lora_request=[lora, None, lora, None])
            llms[overlap] = ([o.outputs[0].token_ids for o in got], llm.engine.steps_ahead)
        finally:
            llm.shutdown()
    assert llms[True][0] == llms[False][0] and llms[True][1] > 0


def test_async_scheduling_with_pipeline_stages_or_lockstep_replicas_is_refused(models):
    from llmctl.engine.errors import EngineConfigError

    with pytest.raises(EngineConfigError, match="--async-scheduling is for --pipeline-parallel-size 1"):
        LLM(str(models["llama"]), pipeline_parallel_size=2, async_scheduling=True)
    with pytest.raises(EngineConfigError, match="--async-scheduling does not run with --enable-expert-parallel"):
        LLM(str(models["llama"]), data_parallel_size=2, enable_expert_parallel=True, async_scheduling=True)


def test_a_server_with_async_scheduling_streams_survives_a_dropped_stream_and_answers_the_same(models):
    """`llmctl serve --async-scheduling` with the official openai client: a stream closed after three chunks
    (its request aborted while its next step is in flight) leaves the server answering, and a greedy completion
    is the offline engine's without async scheduling."""
    from openai import OpenAI

    from helpers.server_helpers import start_server

    folder = str(models["llama"])
    expected, _ = outputs(models["llama"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                          prompts=[PROMPTS[0]])
    server = start_server(folder, "--async-scheduling", "--max-model-len", "256", "--kv-cache-memory", "32MiB")
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        stream = client.completions.create(model=folder, prompt=PROMPTS[3], max_tokens=200, stream=True,
                                           extra_body={"ignore_eos": True})
        for index, _ in enumerate(stream):
            if index == 2:
                break
        stream.close()
        done = client.completions.create(model=folder, prompt=PROMPTS[0], max_tokens=24, temperature=0,
                                         extra_body={"ignore_eos": True})
        assert done.choices[0].text == expected[0][1]
        assert "async scheduling" in server.log and "Traceback" not in server.log
    finally:
        server.stop()
