"""vLLM's loading flags with vLLM's meaning, on a tiny random Llama: --load-format dummy (random weights in
±1e-3 from a folder with no weight files), --tokenizer (another tokenizer and its chat template),
--generation-config (auto, vllm, a folder), --max-logprobs (above vLLM's 20, and below), -q checked
against the checkpoint, --load-format values and vLLM's --attention-backend names."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers.models import random_model
from llmctl import LLM, SamplingParams
from llmctl.engine.config import EngineConfig
from llmctl.errors import LlmctlError

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant]"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer):
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = random_model(config, tmp_path_factory.mktemp("model"), tokenizer)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9}))
    weightless = tmp_path_factory.mktemp("weightless")
    for path in model.iterdir():
        if not path.name.endswith(".safetensors"):
            shutil.copy(path, weightless / path.name)
    other_tokenizer = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(other_tokenizer)
    (other_tokenizer / "chat_template.jinja").write_text(TEMPLATE)
    generation = tmp_path_factory.mktemp("generation")
    (generation / "generation_config.json").write_text(json.dumps({"temperature": 0.2, "top_k": 5}))
    return model, weightless, other_tokenizer, generation


def test_dummy_weights_need_no_weight_files(folders):
    _, weightless, _, _ = folders
    llm = LLM(str(weightless), load_format="dummy", max_model_len=128)
    [output] = llm.generate("Hello", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    assert len(output.outputs[0].token_ids) == 5
    weights = [p.detach() for p in llm.engine.loaded.model.parameters() if p.is_floating_point()]
    assert all(float(p.abs().max()) <= 1e-3 for p in weights) and any(bool(torch.any(p != 0)) for p in weights)
    with pytest.raises(LlmctlError, match="no weight|safetensors"):  # without dummy: the missing files are said
        LLM(str(weightless), max_model_len=128)


def test_tokenizer_and_generation_config_come_from_where_they_are_told(folders, tokenizer):
    model, _, other_tokenizer, generation = folders
    llm = LLM(str(model), tokenizer=str(other_tokenizer), generation_config=str(generation), max_model_len=128)
    assert llm.get_tokenizer().chat_template == TEMPLATE and tokenizer.chat_template != TEMPLATE
    assert llm.engine.loaded.generation_defaults == {"temperature": 0.2, "top_k": 5}
    own = LLM(str(model), max_model_len=128)  # auto: the model's own generation_config.json
    assert own.engine.loaded.generation_defaults == {"temperature": 0.6, "top_p": 0.9}
    assert LLM(str(model), generation_config="vllm", max_model_len=128).engine.loaded.generation_defaults == {}
    with pytest.raises(LlmctlError, match="no generation_config.json"):
        LLM(str(model), generation_config=str(other_tokenizer), max_model_len=128)


def test_max_logprobs_bounds_what_a_request_may_ask(folders):
    model, _, _, _ = folders
    llm = LLM(str(model), max_logprobs=30, max_model_len=128)
    [output] = llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=25, prompt_logprobs=25))
    assert all(len(entry.top) == 25 for entry in output.outputs[0].logprobs)
    with pytest.raises(LlmctlError, match="--max-logprobs 30"):
        llm.generate("Hello", SamplingParams(max_tokens=2, logprobs=31))


def test_quantization_must_name_the_checkpoints_method(folders):
    model, _, _, _ = folders
    with pytest.raises(LlmctlError, match="not quantized and llmctl quantizes no model while loading"):
        LLM(str(model), quantization="fp8", max_model_len=128)


@pytest.mark.parametrize("fields,words", [
    ({"load_format": "tensorizer"}, "auto, safetensors, pt, gguf, dummy"),
    ({"attention_backend": "FLASH_ATTN"}, "vLLM's FLASH_ATTN is not a backend llmctl has"),
    ({"max_logprobs": -1}, "at least 0"),
    ({"kv_cache_dtype": "fp8_e5m3"}, "not supported; use auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2"),
])
def test_what_llmctl_does_not_load_is_refused_by_name(fields, words):
    with pytest.raises(LlmctlError, match=words):
        EngineConfig(**fields).validate()


def test_vllms_attention_backend_names_are_llmctls_kernels():
    for vllm_name, ours in (("TRITON_ATTN", "triton"), ("CPU_ATTN", "cpu"), ("TORCH_SDPA", "cpu"), ("torch", "torch")):
        config = EngineConfig(attention_backend=vllm_name)
        config.validate()
        assert config.attention_backend == ours
    config = EngineConfig(load_format="pt")
    config.validate()
    assert config.allow_pickle_weights  # vLLM's pt: the pickled .bin files
