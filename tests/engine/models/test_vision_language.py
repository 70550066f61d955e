"""Vision-language families (LLaVA-1.5, Idefics3/SmolVLM, Qwen2-VL with M-RoPE) on the paged engine against transformers'
ForConditionalGeneration classes with their real processors: greedy tokens for one and two images of different
sizes (C++ and Triton-interpreter attention), prefix caching keyed by the image, chunked prefill across an image
and preemption (each image encoded once), and a text-only start that skips the tower."""

from __future__ import annotations

import pytest

from helpers.vision_models import WRITERS, chat_text, model_class, random_image, transformers_greedy

TOKENS = 8
IMAGES = [random_image(50, 40, seed=0), random_image(30, 64, seed=1), random_image(45, 45, seed=2)]


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family(request):
    return request.param


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tokenizer, family):
    """The family's tiny checkpoint (named for the first family; every test here runs for each)."""
    return WRITERS[family](tmp_path_factory.mktemp(family) / family, tokenizer)


@pytest.fixture(scope="module")
def cases(folder, family):
    """(prompt text, images, transformers' greedy tokens): one image, two images, another single image."""
    plans = [(1, IMAGES[:1]), (2, IMAGES[:2]), (1, IMAGES[2:])]
    return [(chat_text(folder, n), images, transformers_greedy(folder, model_class(family), chat_text(folder, n), images,
                                                              TOKENS))
            for n, images in plans]


def generate(llm, cases):
    from llmctl import SamplingParams

    prompts = [{"prompt": text, "multi_modal_data": {"image": images}} for text, images, _ in cases]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True))
    return [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_greedy_tokens_match_transformers(folder, cases, backend):
    from llmctl import LLM

    llm = LLM(str(folder), max_model_len=256, attention_backend=backend)
    assert generate(llm, cases) == [reference for _, _, reference in cases]
    assert len({tuple(reference) for _, _, reference in cases}) == 3  # the images change the answer


def test_prefix_cache_is_keyed_by_the_image(folder, cases):
    from llmctl import LLM

    llm = LLM(str(folder), max_model_len=256)
    first, _, other = cases
    stats = llm.engine.block_manager.stats
    assert generate(llm, [first]) == [first[2]]
    hits = stats.hits
    assert generate(llm, [first]) == [first[2]]  # the same image again: its blocks come from the cache
    assert stats.hits - hits >= 16
    hits = stats.hits
    assert generate(llm, [(first[0], other[1], other[2])]) == [other[2]]  # same text, another image
    assert stats.hits == hits  # every block of this prompt holds image placeholders: none may be reused
    uncached = LLM(str(folder), max_model_len=256, enable_prefix_caching=False)
    assert generate(uncached, cases) == [reference for _, _, reference in cases]


def test_chunked_prefill_and_preemption_encode_each_image_once(folder, cases):
    from llmctl import LLM

    probe = LLM(str(folder), max_model_len=256)
    geometry = probe.engine.loaded.kv_geometry
    longest = max(len(probe.engine.multimodal.process(text, images).token_ids) for text, images, _ in cases)
    memory = geometry.sequence_bytes(longest + TOKENS, 8) + geometry.block_bytes  # the longest fits, not two
    llm = LLM(str(folder), max_model_len=longest + TOKENS, max_num_batched_tokens=8, kv_cache_memory=memory)
    assert generate(llm, cases) == [reference for _, _, reference in cases]  # 8-token chunks split each image
    assert llm.engine.scheduler.num_preemptions > 0
    encoded = llm.engine.executor.runner.encoder_cache.encoded  # chunks and recomputation took the cached output:
    shared, *own = [item.content_hash for item in llm.engine.multimodal.process(cases[1][0], cases[1][1]).items] + \
        [item.content_hash for item in llm.engine.multimodal.process(cases[2][0], cases[2][1]).items]
    assert [encoded[h] for h in own] == [1, 1]  # each image of one request: encoded once
    assert 1 <= encoded[shared] <= 2  # the first two requests' image: again only if the first had finished
    assert llm.engine.scheduler.encoder.users == {}  # no live sequence needs an image
    llm.generate("Hello")  # the frees ride on the next step
    assert llm.engine.executor.runner.encoder_cache.outputs == {}


def test_text_only_serving_skips_the_tower(folder):
    from llmctl import LLM, SamplingParams

    llm = LLM(str(folder), max_model_len=256, limit_mm_per_prompt='{"image": 0}')
    assert llm.engine.executor.runner.encoder_cache is None
    model = llm.engine.executor.runner.model
    assert getattr(model, "vision_tower", None) is None and getattr(model, "vision_model", None) is None
    with pytest.raises(ValueError, match="takes no images"):
        llm.generate({"prompt": "x <image>", "multi_modal_data": {"image": IMAGES[0]}})
    assert llm.generate("Hello", SamplingParams(max_tokens=2))[0].outputs[0].token_ids


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl", "gemma3"], indirect=True)
@pytest.mark.parametrize("layout", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_tensor_and_pipeline_parallel_ranks_give_transformers_tokens(folder, cases, family, layout):
    """Every TP rank encodes the images itself (the tower is whole on each); with PP only the first stage does,
    every stage rotates by the M-RoPE positions (Qwen), the DeepStack features stay on the first stage that adds
    them (Qwen3-VL), and every stage's attention lets an image's tokens see each other both ways (Gemma 3)."""
    from llmctl import LLM

    llm = LLM(str(folder), max_model_len=256, kv_cache_memory=64 * 1024**2, **layout)
    try:
        assert generate(llm, cases) == [reference for _, _, reference in cases]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family", ["gemma3"], indirect=True)
def test_gemma3_refuses_pan_and_scan_and_names_its_placeholder(folder, family):
    from llmctl import LLM
    from llmctl.engine.errors import InvalidRequestError

    llm = LLM(str(folder), max_model_len=256)
    with pytest.raises(InvalidRequestError, match="do_pan_and_scan is not supported"):
        llm.generate({"prompt": chat_text(folder, 1), "multi_modal_data": {"image": IMAGES[0]},
                      "mm_processor_kwargs": {"do_pan_and_scan": True}})
    with pytest.raises(InvalidRequestError, match="<start_of_image>"):
        llm.generate({"prompt": chat_text(folder, 1) * 2, "multi_modal_data": {"image": IMAGES[0]}})
