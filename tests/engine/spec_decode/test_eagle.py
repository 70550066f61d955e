"""EAGLE-1/2 heads (--speculative-config method eagle) in EAGLE's published layout on a random 6-layer Llama: the
head's first draft after a prompt and after verified steps equals EAGLE computed from its definition (transformers'
one-layer LlamaModel over transformers' final hidden states, no cache), and the greedy output equals transformers'
without speculation; a head for another model is refused by what differs."""

from __future__ import annotations

import pytest
import torch

from helpers.eagle_heads import PROMPT, eagle_target, reference_first_draft, save_eagle_head
from llmctl import LLM, SamplingParams
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.front.llm_engine import LLMEngine


@pytest.fixture(scope="module")
def target(tmp_path_factory, tokenizer):
    return eagle_target(tmp_path_factory.mktemp("eagle") / "target", tokenizer)


CAPTURED = pytest.param(False, "captured", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")], id="eagle-captured")


@pytest.mark.parametrize(("para_norm", "graphs"), [
    pytest.param(False, None, id="eagle"), pytest.param(True, None, id="hass"),
    pytest.param(False, "buffers", id="eagle-graph-buffers"), CAPTURED])
def test_drafts_equal_eagle_from_its_definition_and_output_the_targets(target, tmp_path, para_norm, graphs):
    """`graphs`: the target's uniform steps through CUDA graphs' static buffers (captured and replayed on a GPU,
    run eagerly on a CPU): the head must read the hidden states of the graph just replayed."""
    folder, _, reference = target
    head = save_eagle_head(tmp_path / "head", folder, seed=3, para_norm=para_norm)
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(PROMPT):].tolist()
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": 3}
    through = {} if graphs is None else {"attention_backend": "triton", "dtype": "float32", "max_num_seqs": 4,
                                         "device": "cuda" if graphs == "captured" else "auto",
                                         "graph_buffers_on_cpu": graphs == "buffers"}
    engine = LLMEngine(model=str(folder), max_model_len=128, block_size=16, speculative_config=spec, **through)
    replays = replays_of(engine) if graphs else []
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    checked, final = 0, None
    while engine.has_unfinished_requests:
        final = next((out for out in engine.step() if out.finished), final)
        running = engine.scheduler.running
        if running and running[0].draft is not None:
            seq = running[0]
            assert seq.draft.token_ids[0] == reference_first_draft(reference, head, seq.all_token_ids)
            checked += 1
    assert checked >= 3
    assert final is not None and list(final.outputs[0].token_ids) == expected
    assert not graphs or (1, 4) in replays  # verification steps (1 + 3 tokens) went through the graphs


def replays_of(engine: LLMEngine) -> list[tuple[int, int]]:
    """(sequences, new tokens each) of every step the graphs run, from now on."""
    graphs, replays = engine.executor.runner.graphs, []
    assert graphs is not None
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: replays.append((len(batch.seq_lens), shape[1])) or run(batch, shape, *rest)
    return replays


def test_a_head_for_another_model_is_refused_by_what_differs(target, tmp_path):
    folder, _, _ = target
    head = save_eagle_head(tmp_path / "head", folder, seed=4, num_key_value_heads=6)
    with pytest.raises(SpeculativeConfigError, match="num_key_value_heads 6, the target 2: is it a head for this model"):
        LLM(str(folder), max_model_len=64, speculative_config={"method": "eagle", "model": str(head),
                                                                "num_speculative_tokens": 2})
