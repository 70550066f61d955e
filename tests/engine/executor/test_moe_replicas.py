"""Expert parallelism across data-parallel replicas (`--dp 2 --enable-expert-parallel`, EP = TP × DP as vLLM
spreads experts): each replica holds its share of whole experts, the replicas' tokens meet at every MoE
layer, and an idle replica lends its experts; the tokens are transformers' on the same random weights."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers.families import PROMPTS, TOKENS, assert_close, moe_config, transformers_reference
from helpers.models import save_random_model

pytestmark = pytest.mark.subprocess


def generate_on_replicas(engine, prompts: list[str]) -> list:
    """Every prompt at once (both replicas busy, finishing at different steps), then the first alone
    (the other replica idle: it only lends its experts)."""
    from llmctl.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=0, prompt_logprobs=0)

    async def one(prompt: str, request_id: str):
        outputs = [output async for output in engine.generate(prompt, params, request_id)]
        return outputs[-1]

    async def run():
        together = await asyncio.gather(*(one(p, f"r{i}") for i, p in enumerate(prompts)))
        return list(together) + [await one(prompts[0], "alone")]

    return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs],
             [lp.logprob for lp in o.prompt_logprobs[1:]]) for o in asyncio.run(run())]


@pytest.mark.parametrize("tp", [1, 2])
def test_experts_spread_over_replicas_give_transformers_tokens(tmp_path, tokenizer, tp):
    """Qwen2-MoE's 16 experts over TP × 2 replicas: 8 (TP 1) or 4 (TP 2) whole experts per rank, each rank's
    weight bytes what `plan --enable-expert-parallel` counts for EP = TP × DP, and 8 prompts × 64 greedy
    tokens as transformers, log-probabilities within 1e-3."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.front.data_parallel import DataParallelEngine
    from llmctl.engine.layers.moe import FusedMoE
    from llmctl.sizing.weights import stage_weights, weight_format

    folder = save_random_model(moe_config("qwen2-moe", len(tokenizer)), tmp_path / "qwen2-moe", tokenizer)
    engine = DataParallelEngine(EngineConfig(model=str(folder), data_parallel_size=2, tensor_parallel_size=tp,
                                             enable_expert_parallel=True, max_model_len=256,
                                             max_num_batched_tokens=16, kv_cache_memory=64 * 1024**2))
    try:
        ours = generate_on_replicas(engine, PROMPTS)
        drivers = [e.executor.loaded for e in engine.engines]  # each replica's TP rank 0
        held = [next(m for m in d.model.modules() if isinstance(m, FusedMoE)).local_experts for d in drivers]
        memory = [m for e in engine.engines for m in e.executor.rank_memory]
    finally:
        engine.shutdown()
    reference = transformers_reference(folder, tokenizer)
    assert_close(reference, ours[:-1])
    assert_close(reference[:1], ours[-1:], PROMPTS[:1])
    per_rank = 16 // (2 * tp)
    assert held == [range(0, per_rank), range(tp * per_rank, (tp + 1) * per_rank)]
    spec = load_spec(resolve_model(str(folder)))
    [weights] = stage_weights(spec, weight_format(4, None, spec), tp, 1, expert_ranks=2 * tp)
    assert len(memory) == 2 * tp and all(weights_bytes == weights.total_bytes for weights_bytes, _ in memory)


def test_served_over_replicas_through_the_openai_client(tmp_path, tokenizer):
    """`llmctl serve --dp 2 --enable-expert-parallel`: four requests at once and one alone, each the text
    transformers generates."""
    import openai

    from helpers.server_helpers import start_server

    folder = save_random_model(moe_config("mixtral", len(tokenizer)), tmp_path / "mixtral", tokenizer)
    prompts = PROMPTS[:4]
    reference = transformers_reference(folder, tokenizer, prompts=prompts, max_tokens=16)
    server = start_server(str(folder), "--served-model-name", "mixtral", "--data-parallel-size", "2",
                          "--enable-expert-parallel", "--max-model-len", "256")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

        def complete(prompt: str) -> str:
            return client.completions.create(model="mixtral", prompt=prompt, max_tokens=16, temperature=0,
                                             extra_body={"ignore_eos": True}).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            texts = list(pool.map(complete, prompts))
        texts.append(complete(prompts[1]))
    finally:
        server.stop()
    expected = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens, _, _ in reference]
    assert texts == expected + expected[1:2]


@pytest.mark.parametrize("flags, message", [
    (dict(data_parallel_size=3), r"16 experts cannot be spread evenly over 3 expert-parallel ranks \(TP 1 × 3 "
                                 r"replicas\)\. --dp sizes that work with --tp 1: 1, 2, 4, 8, 16$"),
    (dict(data_parallel_size=2, pipeline_parallel_size=2), r"one pipeline stage each: use --pp 1"),
])
def test_layouts_that_cannot_spread_the_experts_are_refused_before_any_replica_starts(tmp_path, tokenizer,
                                                                                    flags, message):
    from llmctl.engine.config import EngineConfig
    from llmctl.engine.errors import EngineConfigError
    from llmctl.engine.front.data_parallel import DataParallelEngine

    folder = save_random_model(moe_config("qwen2-moe", len(tokenizer)), tmp_path / "qwen2-moe", tokenizer)
    with pytest.raises(EngineConfigError, match=message):
        DataParallelEngine(EngineConfig(model=str(folder), enable_expert_parallel=True, **flags))


def test_bench_offline_spreads_the_experts_over_its_replicas(tmp_path, tokenizer):
    """`llmctl bench offline --dp 2 --enable-expert-parallel` runs the replicas as the server does: each
    holds half of the experts (plan's bytes for EP = 2), not all of them."""
    import json

    from helpers.cli_process import run_cli
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.sizing.weights import stage_weights, weight_format

    folder = save_random_model(moe_config("qwen2-moe", len(tokenizer)), tmp_path / "qwen2-moe", tokenizer)
    result = run_cli("bench", "offline", str(folder), "--dp", "2", "--enable-expert-parallel", "--num-prompts", "6",
                     "--random-input-len", "8", "--random-output-len", "8", "--max-model-len", "64",
                     "--dtype", "float32", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    spec = load_spec(resolve_model(str(folder)))
    [weights] = stage_weights(spec, weight_format(4, None, spec), 1, 1, expert_ranks=2)
    assert [rank["weights_bytes"] for rank in report["ranks"]] == [weights.total_bytes]
    assert report["llmctl"]["output_tokens"] == 6 * 8
