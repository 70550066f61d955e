"""Reward models on the paged engine against the formula of their model cards, computed with transformers: a
tiny Qwen2 process reward model (Qwen2.5-Math-PRM's layout: STEP pooling, the softmax of its two-label head at
each step tag) and an outcome reward model (Qwen2.5-Math-RM's: one score per token, ALL pooling); vLLM's
--pooler-config picks the step tag and the returned columns."""

from __future__ import annotations

import pytest

STEPS = ["Step one: add two<|im_end|>Step two: carry the one<|im_end|>", "Only<|im_end|> a single step"]


@pytest.fixture(scope="module")
def reward_models(tmp_path_factory, tokenizer):
    from helpers.decoder_embedders import write_reward_model

    base = tmp_path_factory.mktemp("reward")
    return {arch: write_reward_model(base, arch, tokenizer)
            for arch in ("Qwen2ForProcessRewardModel", "Qwen2ForRewardModel")}


def _tag(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_process_reward_model_gives_each_steps_probabilities(reward_models, tokenizer):
    """The model card's make_step_rewards: softmax over the head's two labels at every step tag's row."""
    import torch

    from helpers.decoder_embedders import reward_reference
    from llmctl import LLM, PoolingParams

    tag = _tag(tokenizer)
    folder = reward_models["Qwen2ForProcessRewardModel"]
    llm = LLM(str(folder), max_model_len=128, pooler_config={"step_tag_id": tag})
    outputs = llm.reward(STEPS)
    raw = llm.reward(STEPS, PoolingParams(use_activation=False))
    for output, unactivated in zip(outputs, raw):
        ids = output.prompt_token_ids
        logits = reward_reference(folder, ids)[torch.tensor(ids) == tag]
        assert output.outputs.data.shape == (ids.count(tag), 2) and ids.count(tag) in (1, 2)
        assert (output.outputs.data - torch.softmax(logits, dim=-1)).abs().max() < 1e-4
        assert (unactivated.outputs.data - logits).abs().max() < 1e-4
    with pytest.raises(ValueError, match="pooling task is embed"):
        llm.embed("a")


def test_outcome_reward_model_scores_every_token(reward_models, tokenizer):
    """Qwen2ForRewardModel: ALL pooling, the one-output head's raw score per token (vLLM's default: no
    activation)."""
    from helpers.decoder_embedders import reward_reference
    from llmctl import LLM

    folder = reward_models["Qwen2ForRewardModel"]
    output = LLM(str(folder), max_model_len=128).reward(STEPS[0])[0]
    expected = reward_reference(folder, output.prompt_token_ids)
    assert output.outputs.data.shape == expected.shape == (len(output.prompt_token_ids), 1)
    assert (output.outputs.data - expected).abs().max() < 1e-4


def test_step_pooling_of_hidden_states_returns_the_asked_columns(embedders, tokenizer):
    """--convert reward with vLLM's math-shepherd recipe: STEP pooling, a step tag and returned_token_ids, on
    a decoder without a score head: those columns of the hidden states at the tag's rows."""
    import torch
    from transformers import AutoModel

    from llmctl import LLM

    tag, folder = _tag(tokenizer), embedders["llama"]
    llm = LLM(str(folder), convert="reward", max_model_len=128,
              pooler_config={"pooling_type": "STEP", "step_tag_id": tag, "returned_token_ids": [5, 1]})
    output = llm.encode(STEPS[0])[0]
    ids = output.prompt_token_ids
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(str(folder))(input_ids=torch.tensor([ids])).last_hidden_state[0]
    expected = hidden[torch.tensor(ids) == tag][:, [5, 1]]
    assert output.outputs.data.shape == expected.shape == (2, 2)
    assert (output.outputs.data - expected).abs().max() < 1e-4


@pytest.mark.parametrize("settings, message", [
    ({"pooling_type": "MEAN"}, "a reward model pools ALL, STEP"),
    ({"seq_pooling_type": "LAST"}, "seq_pooling_type does not apply to this reward model"),
    ({"step_tag_id": -1}, "step_tag_id must be a token id"),
    ({"returned_token_ids": [2]}, "index the 2 outputs of each row; got 2"),
    ({"logit_bias": 1.0}, "does not apply 'logit_bias'"),
])
def test_pooler_config_refuses_what_it_cannot_apply(reward_models, settings, message):
    """Torch-free: resolved from the checkpoint's files as the loader resolves it."""
    import json

    from llmctl.checkpoint.spec import ModelSpec
    from llmctl.engine.errors import EngineConfigError
    from llmctl.engine.pooling.config import resolve_pooler

    folder = reward_models["Qwen2ForProcessRewardModel"]
    spec = ModelSpec.from_config(json.loads((folder / "config.json").read_text()))
    default = resolve_pooler("auto", "auto", spec, folder)
    assert default is not None and (default.pooling, default.step_tag_id, default.labels) == ("STEP", 151651, 2)
    with pytest.raises(EngineConfigError, match=message):
        resolve_pooler("auto", "auto", spec, folder, overrides=settings)


def test_inspect_names_the_reward_head_and_step_pooling(reward_models):
    from llmctl.checkpoint.source import resolve_model
    from llmctl.inspect_report import build_inspect_report

    report = build_inspect_report(resolve_model(str(reward_models["Qwen2ForProcessRewardModel"]),
                                                show_progress=False))
    pooling = report.pooling
    assert pooling is not None and (pooling.task, pooling.pooling, pooling.labels) == ("reward", "STEP", 2)
    assert report.implementation == "llmctl"  # Qwen2's native layers
    assert "reward model: STEP pooling (the rows of token 151651)" in pooling.describe()
    assert "a score head of 2 outputs" in pooling.describe()


def test_served_process_reward_model_answers_pooling(reward_models, tokenizer):
    """/pooling on `llmctl serve --pooler-config`: the step probabilities by default (vLLM's use_activation for
    token classifiers), the head's raw scores with use_activation false; usage counts the prompt."""
    import httpx
    import torch

    from helpers.decoder_embedders import reward_reference
    from helpers.server_helpers import start_server

    tag, folder = _tag(tokenizer), reward_models["Qwen2ForProcessRewardModel"]
    server = start_server(str(folder), "--max-model-len", "128", "--pooler-config", f'{{"step_tag_id": {tag}}}')
    try:
        answer = httpx.post(server.url + "/pooling", json={"input": STEPS[0]}).json()
        raw = httpx.post(server.url + "/pooling", json={"input": [STEPS[0]], "use_activation": False}).json()
        wrong = httpx.post(server.url + "/pooling", json={"input": STEPS[0], "use_activation": "yes"})
    finally:
        server.stop()
    ids = tokenizer(STEPS[0])["input_ids"]
    logits = reward_reference(folder, ids)[torch.tensor(ids) == tag]
    assert (torch.tensor(answer["data"][0]["data"]) - torch.softmax(logits, dim=-1)).abs().max() < 1e-4
    assert (torch.tensor(raw["data"][0]["data"]) - logits).abs().max() < 1e-4
    assert answer["usage"]["prompt_tokens"] == len(ids)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "use_activation"
