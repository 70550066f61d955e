"""Structured outputs wherever the engine runs (issue 35): tensor-parallel ranks, data-parallel replicas
and the Triton attention backend give the single-process engine's greedy tokens under the same grammar
(that engine is checked against transformers with xgrammar's own logits processor in
test_structured_outputs.py), and a LoRA adapter's output follows the grammar too. A small random Llama;
compact JSON (disable_any_whitespace) so a random model finishes the object."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from helpers.lora_helpers import make_adapter
from helpers.models import save_random_model
from llmctl import LLM, SamplingParams
from llmctl.engine.structured.params import StructuredOutputsParams

SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["color", "n"], "additionalProperties": False}
PROMPTS = ["The capital of France is", "1, 2, 3, 4,"]
PARAMS = SamplingParams(temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(
    json=SCHEMA, disable_any_whitespace=True))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return save_random_model(config, tmp_path_factory.mktemp("structured") / "base", tokenizer)


def tokens(outputs) -> list[list[int]]:
    for output in outputs:
        jsonschema.validate(json.loads(output.outputs[0].text), SCHEMA)
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture(scope="module")
def single(tiny) -> list[list[int]]:
    return tokens(LLM(str(tiny), max_model_len=256).generate(PROMPTS, PARAMS))


def test_tensor_parallel_ranks(tiny, single):
    llm = LLM(str(tiny), tensor_parallel_size=2, max_model_len=256, kv_cache_memory=64 * 1024**2)
    try:
        assert tokens(llm.generate(PROMPTS, PARAMS)) == single
    finally:
        llm.shutdown()


def test_cuda_graph_buffers(tiny, single):
    """Decode steps through the CUDA graphs' static buffers (run eagerly here), the grammar on their logits."""
    llm = LLM(str(tiny), max_model_len=256, attention_backend="triton", graph_buffers_on_cpu=True)
    graphs = llm.engine.executor.runner.graphs
    steps: list[tuple[int, int]] = []
    run = graphs.run
    graphs.run = lambda batch, shape, *rest: steps.append(shape) or run(batch, shape, *rest)
    assert tokens(llm.generate(PROMPTS, PARAMS)) == single
    assert (2, 1) in steps


def test_data_parallel_replicas(tiny, single):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.front.data_parallel import DataParallelEngine

    replicas = DataParallelEngine(EngineConfig(model=str(tiny), max_model_len=256, data_parallel_size=2))
    try:
        async def one(index: int) -> list[int]:
            async for output in replicas.generate(PROMPTS[index], PARAMS, f"dp-{index}"):
                final = output
            return tokens([final])[0]

        async def both() -> list[list[int]]:
            return await asyncio.gather(one(0), one(1))

        assert asyncio.run(both()) == single
    finally:
        replicas.shutdown()


def test_the_triton_backend(tiny, single):
    assert tokens(LLM(str(tiny), max_model_len=256, attention_backend="triton").generate(PROMPTS, PARAMS)) == single


def test_a_lora_adapter(tiny, tmp_path):
    from llmctl.engine.lora.request import LoRARequest

    adapter = make_adapter(tiny, tmp_path / "adapter", rank=4, targets=["q_proj", "v_proj", "down_proj"], seed=1)
    llm = LLM(str(tiny), max_model_len=256, enable_lora=True, max_lora_rank=4)
    with_adapter = tokens(llm.generate(PROMPTS, PARAMS, LoRARequest("a", 1, str(adapter))))
    assert with_adapter != single  # the adapter changed the model, the grammar still held
