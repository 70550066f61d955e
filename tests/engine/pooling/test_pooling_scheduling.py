"""Pooling requests are prefill-only on the engine: a last-token pooler's prompt may be chunked and its KV
blocks all come back when it is done; a mean pooler's prompt runs whole in one step (it waits for room, never
split) and one longer than a step's budget is refused. Outputs checked against sentence-transformers."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.decoder_embedders import reference

LONG = "one two three four five six seven eight nine ten " * 4


def _run(engine, prompts):
    from llmctl import PoolingParams

    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, PoolingParams())
    outputs, steps = {}, 0
    while engine.has_unfinished_requests:
        steps += 1
        outputs.update({o.request_id: o for o in engine.step() if o.finished})
    return np.array([outputs[str(i)].outputs.data.numpy() for i in range(len(prompts))]), steps


def test_last_token_pooling_chunks_long_prompts_and_frees_every_block(embedders):
    from llmctl.engine.front.llm_engine import LLMEngine

    engine = LLMEngine(model=str(embedders["qwen3"]), max_model_len=128, max_num_batched_tokens=16)
    ours, steps = _run(engine, [LONG, "short one"])
    assert len(engine.tokenizer.encode(LONG)) > 32 and steps >= 3  # the long prompt took several chunks
    assert np.abs(ours - reference(embedders["qwen3"], [LONG, "short one"])).max() < 1e-4
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # no KV kept after pooling


def test_mean_pooling_runs_each_prompt_whole(embedders):
    from llmctl.engine.errors import InvalidRequestError
    from llmctl.engine.front.llm_engine import LLMEngine

    engine = LLMEngine(model=str(embedders["llama"]), max_model_len=128, max_num_batched_tokens=16)
    prompts = ["one two three four five six seven", "eight nine ten eleven twelve", "a b c d e f g h"]
    lengths = [len(engine.tokenizer.encode(p)) for p in prompts]
    assert all(length <= 16 for length in lengths) and sum(lengths) > 16  # not all in one step
    ours, steps = _run(engine, prompts)
    assert steps >= 2 and np.abs(ours - reference(embedders["llama"], prompts)).max() < 1e-4
    from llmctl import PoolingParams

    with pytest.raises(InvalidRequestError, match="MEAN pooling computes an input in one step") as error:
        engine.add_request("long", LONG, PoolingParams())
    assert error.value.param == "input"
