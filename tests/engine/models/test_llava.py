"""LLaVA-1.5 on the paged engine against transformers' LlavaForConditionalGeneration: greedy tokens for one and
two images of different sizes (C++ and Triton-interpreter attention), prefix caching keyed by the image,
chunked prefill across an image and preemption (each image encoded once), and a text-only start."""

from __future__ import annotations

import pytest

from helpers.vision_models import chat_text, random_image, transformers_greedy, write_llava

TOKENS = 8
IMAGES = [random_image(50, 40, seed=0), random_image(30, 64, seed=1), random_image(45, 45, seed=2)]


@pytest.fixture(scope="module")
def llava(tmp_path_factory, tokenizer):
    return write_llava(tmp_path_factory.mktemp("llava") / "llava", tokenizer)


@pytest.fixture(scope="module")
def cases(llava):
    """(prompt text, images, transformers' greedy tokens): one image, two images, another single image."""
    from transformers import LlavaForConditionalGeneration

    plans = [(1, IMAGES[:1]), (2, IMAGES[:2]), (1, IMAGES[2:])]
    return [(chat_text(llava, n), images, transformers_greedy(llava, LlavaForConditionalGeneration,
                                                              chat_text(llava, n), images, TOKENS))
            for n, images in plans]


def generate(llm, cases):
    from llmctl import SamplingParams

    prompts = [{"prompt": text, "multi_modal_data": {"image": images}} for text, images, _ in cases]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True))
    return [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_greedy_tokens_match_transformers(llava, cases, backend):
    from llmctl import LLM

    llm = LLM(str(llava), max_model_len=256, attention_backend=backend)
    assert generate(llm, cases) == [reference for _, _, reference in cases]
    assert len({tuple(reference) for _, _, reference in cases}) == 3  # the images change the answer


def test_prefix_cache_is_keyed_by_the_image(llava, cases):
    from llmctl import LLM

    llm = LLM(str(llava), max_model_len=256)
    first, _, other = cases
    stats = llm.engine.block_manager.stats
    assert generate(llm, [first]) == [first[2]]
    hits = stats.hits
    assert generate(llm, [first]) == [first[2]]  # the same image again: its blocks come from the cache
    assert stats.hits - hits >= 16
    hits = stats.hits
    assert generate(llm, [(first[0], other[1], other[2])]) == [other[2]]  # same text, another image
    assert stats.hits == hits  # every block of this prompt holds image placeholders: none may be reused
    uncached = LLM(str(llava), max_model_len=256, enable_prefix_caching=False)
    assert generate(uncached, cases) == [reference for _, _, reference in cases]


def test_chunked_prefill_and_preemption_encode_each_image_once(llava, cases):
    from llmctl import LLM

    probe = LLM(str(llava), max_model_len=256)
    block_bytes = probe.engine.loaded.kv_geometry.block_bytes
    llm = LLM(str(llava), max_model_len=80, max_num_batched_tokens=8, kv_cache_memory=5 * block_bytes)
    assert generate(llm, cases) == [reference for _, _, reference in cases]  # 8-token chunks split each image
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.executor.runner.encoder_cache.encoded == 3  # chunks and recomputation took the cached output
    assert llm.engine.scheduler.encoder.users == {}  # no live sequence needs an image
    llm.generate("Hello")  # the frees ride on the next step
    assert llm.engine.executor.runner.encoder_cache.outputs == {}


def test_text_only_serving_skips_the_tower(llava):
    from llmctl import LLM, SamplingParams

    llm = LLM(str(llava), max_model_len=256, limit_mm_per_prompt='{"image": 0}')
    assert llm.engine.executor.runner.encoder_cache is None
    assert llm.engine.executor.runner.model.vision_tower is None  # its weights were never read
    with pytest.raises(ValueError, match="takes no images"):
        llm.generate({"prompt": "x <image>", "multi_modal_data": {"image": IMAGES[0]}})
    assert llm.generate("Hello", SamplingParams(max_tokens=2))[0].outputs[0].token_ids
