"""EAGLE-3 (--speculative-config method eagle3) with random heads in the published layout on a random 6-layer
Llama: the head's first draft after a prompt, and after a verified step, equals EAGLE-3 computed from its
definition over the whole sequence (transformers' hidden states, no cache) — so its paged KV, the catch-up and
the positions are right; greedy output equals transformers' without speculation, with a head whose drafts are
mostly rejected and with one whose drafts the target often accepts."""

from __future__ import annotations

import pytest
import torch

from helpers.eagle3_heads import reference_first_draft, save_eagle3_head
from helpers.eagle_heads import PROMPT, eagle_target
from llmctl import LLM, SamplingParams
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError, SpeculativeConfigError
from llmctl.engine.front.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def target(tmp_path_factory, tokenizer):
    return eagle_target(tmp_path_factory.mktemp("eagle3") / "target", tokenizer)


def spec(head, k: int = 3) -> dict:
    return {"method": "eagle3", "model": str(head), "num_speculative_tokens": k}


@pytest.mark.parametrize("captured", [False, pytest.param(True, marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")])])
def test_first_drafts_equal_eagle3_computed_from_its_definition(target, tmp_path, captured):
    """`captured`: the target's uniform steps replay CUDA graphs; the head reads the states the graph kept."""
    folder, config, reference = target
    head = save_eagle3_head(tmp_path / "head", config, list(range(0, config.vocab_size, 97)), seed=1)
    graphs = {"attention_backend": "triton", "dtype": "float32", "device": "cuda"} if captured else {}
    engine = LLMEngine(model=str(folder), max_model_len=128, block_size=16, speculative_config=spec(head), **graphs)
    assert not captured or engine.executor.runner.graphs.graphs
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=12, temperature=0))
    for _ in range(3):  # the prompt, then two verified steps (whatever they accepted)
        engine.step()
        seq = engine.scheduler.running[0]
        assert seq.draft is not None
        assert seq.draft.token_ids[0] == reference_first_draft(reference, head, seq.all_token_ids)


@pytest.mark.parametrize("constant", [False, True])
def test_greedy_output_is_the_targets_whatever_the_drafts(target, tmp_path, constant):
    folder, config, reference = target
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(PROMPT):].tolist()
    favourite = max(set(expected), key=expected.count)
    # the constant head has one token, the target's commonest: it drafts it whatever the context
    ids = [favourite] if constant else list(range(0, config.vocab_size, 89))
    head = save_eagle3_head(tmp_path / "head", config, ids, seed=2)
    llm = LLM(str(folder), max_model_len=128, speculative_config=spec(head, 4))
    out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=24, ignore_eos=True, temperature=0))
    assert list(out[0].outputs[0].token_ids) == expected
    stats = llm.engine.speculator.stats
    assert stats.num_drafts > 0
    if constant and expected.count(favourite) > len(expected) // 3:
        assert stats.num_accepted_tokens > 0  # the chain and its partial acceptance were exercised


def test_refusals_with_async_scheduling_and_mtp_on_a_model_without_mtp_layers(target):
    with pytest.raises(EngineConfigError, match="does not run with --speculative-config method eagle3"):
        EngineConfig(speculative_config=spec("head"), async_scheduling=True).validate()
    with pytest.raises(SpeculativeConfigError, match="has none llmctl runs"):
        LLM(str(target[0]), max_model_len=64, speculative_config={"method": "mtp", "num_speculative_tokens": 1})
