"""--kv-offloading-size end to end on this CPU (a tiny random Llama, float32): with a device pool too small for two
long conversations, each one's second turn loads its evicted prefix from the CPU tier (the engine's counters and
/metrics' vLLM-named series say so) and its greedy tokens are transformers' — the loaded K/V is the K/V a full
prefill computes — and the same as without the tier, which recomputes the prefix instead."""

from __future__ import annotations

import random

import pytest
import torch

from helpers.models import save_random_model, small_config
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.engine.front.llm import LLM
from llmctl.engine.sampling_params import SamplingParams
from llmctl.server.metrics import ServerMetrics

BLOCK_BYTES = 16 * 2 * 2 * 2 * 16 * 4  # tokens · layers · (K, V) · KV heads · head dim · float32 (small_config)
GREEDY = SamplingParams(max_tokens=6, temperature=0)
ON_A_GPU = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="the copy stream needs a CUDA GPU")])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer):
    return save_random_model(small_config("llama-gqa", tokenizer), tmp_path_factory.mktemp("offload") / "m",
                             tokenizer)


def conversations(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """Two 180-token conversations, turn after turn: (each second turn's prompt, every turn's tokens)."""
    first = [[random.Random(seed).randrange(100, 40000) for _ in range(180)] for seed in (1, 2)]
    replies = [llm.generate([prompt], GREEDY)[0].outputs[0].token_ids for prompt in first]
    second = [prompt + list(reply) + [500 + i, 600] for i, (prompt, reply) in enumerate(zip(first, replies))]
    return second, [list(reply) for reply in replies] + [list(llm.generate([p], GREEDY)[0].outputs[0].token_ids)
                                                         for p in second]


@pytest.mark.parametrize("device", ["cpu", ON_A_GPU])
def test_second_turns_load_their_prefix_from_the_cpu_tier_and_keep_transformers_tokens(folder, device):
    """On a GPU the copies run on the tier's own stream (pinned host memory), the same checks hold."""
    from transformers import AutoModelForCausalLM

    pool = 16 * BLOCK_BYTES  # one conversation's blocks, not two
    engine = {"max_model_len": 256, "kv_cache_memory": pool, "device": device, "dtype": "float32"}
    llm = LLM(str(folder), kv_offloading_size=64 * BLOCK_BYTES / 2**30, **engine)
    assert (llm.engine.loaded.host_kv.stream is not None) == (device == "cuda")
    second, tokens = conversations(llm)
    stats = llm.engine.stats()
    plain = LLM(str(folder), **engine)
    _, plain_tokens = conversations(plain)
    plain_stats = plain.engine.stats()
    assert tokens == plain_tokens
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for prompt, ours in zip(second, tokens[2:]):
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0, len(prompt):]
        assert ours == expected.tolist()
    # each second turn found all 11 full blocks of its prompt (176 tokens), on the device or in the tier; what the
    # device pool no longer held (at least one whole conversation's) came from the tier, where the run without it
    # recomputed them
    tier = stats.offload
    assert stats.prefix_cache_hits == 2 * 176 and tier.hits >= 176
    assert tier.hits == stats.prefix_cache_hits - plain_stats.prefix_cache_hits
    assert tier.load_bytes == tier.hits // 16 * BLOCK_BYTES <= tier.store_bytes
    rendered = ServerMetrics(lambda: [stats], "tiny", "vllm").render().decode()
    assert f'vllm:external_prefix_cache_hits_total{{model_name="tiny"}} {float(tier.hits)}' in rendered
    assert f'vllm:kv_offload_load_bytes_total{{model_name="tiny"}} {float(tier.load_bytes)}' in rendered
    assert "external_prefix_cache" not in ServerMetrics(lambda: [plain_stats], "tiny").render().decode()


@pytest.mark.parametrize(("fields", "says"), [
    ({"kv_offloading_size": 0}, "give the CPU tier's size in GiB"),
    ({"kv_offloading_size": 4, "enable_prefix_caching": False}, "it needs prefix caching"),
    ({"kv_offloading_size": 4, "kv_offloading_backend": "lmcache"}, "native"),
])
def test_offloading_settings_that_cannot_work_are_refused(fields, says):
    with pytest.raises(EngineConfigError, match=says):
        EngineConfig(**fields).validate()
