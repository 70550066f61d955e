"""Multi-token prediction (--speculative-config method mtp) on tiny random DeepSeek-V3 and GLM-4.5 models whose
checkpoints carry one MTP layer in the published names: the layer's first draft after a prompt, and after verified
steps, equals the layer computed from its definition (transformers' own decoder layer of the family as its block,
transformers' hidden states, no cache); greedy output equals transformers' without speculation; a checkpoint whose
config names an MTP layer it does not ship is refused by what is missing."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers.families import save_routed_moe
from helpers.mtp_models import reference_first_draft, save_with_mtp, tiny_glm4_moe_config, tiny_v3_config
from llmctl import LLM, SamplingParams
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.front.llm_engine import LLMEngine

PROMPT = [1, 450, 701, 112, 318, 9, 27, 88, 1000, 4, 5]
MTP = {"method": "mtp", "num_speculative_tokens": 2}


@pytest.fixture(scope="module", params=[tiny_v3_config, tiny_glm4_moe_config], ids=["deepseek_v3", "glm4_moe"])
def target(tmp_path_factory, tokenizer, request):
    folder = save_with_mtp(request.param(len(tokenizer)), tmp_path_factory.mktemp("mtp") / "model", tokenizer)
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def test_first_drafts_equal_the_mtp_layer_computed_from_its_definition(target):
    folder, reference = target
    engine = LLMEngine(model=str(folder), max_model_len=128, speculative_config=MTP)
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=10, temperature=0))
    for _ in range(3):
        engine.step()
        seq = engine.scheduler.running[0]
        assert seq.draft is not None
        assert seq.draft.token_ids[0] == reference_first_draft(reference, folder, seq.all_token_ids)


def test_greedy_output_is_the_targets(target):
    folder, reference = target
    expected = reference.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                                  pad_token_id=0)[0, len(PROMPT):].tolist()
    llm = LLM(str(folder), max_model_len=128, speculative_config={**MTP, "method": "deepseek_mtp"})
    out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=16, ignore_eos=True, temperature=0))
    assert list(out[0].outputs[0].token_ids) == expected
    assert llm.engine.speculator.stats.num_drafts > 0


def test_a_config_naming_an_mtp_layer_its_checkpoint_lacks_is_refused(tmp_path, tokenizer):
    folder = save_routed_moe(tiny_glm4_moe_config(len(tokenizer)), tmp_path / "glm", tokenizer)  # no layer 3 saved
    with pytest.raises(SpeculativeConfigError, match=r"ships no model\.layers\.3\.\* tensors"):
        LLM(str(folder), max_model_len=64, speculative_config=MTP)
