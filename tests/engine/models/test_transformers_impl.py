"""`--model-impl transformers`: families llmctl has no native code for, run as transformers' modules
around llmctl's paged attention, against transformers' own generate."""

from __future__ import annotations

import pytest

from helpers.families import assert_close, engine_outputs, granite_config, transformers_reference
from helpers.models import save_random_model
from llmctl import LLM
from llmctl.errors import UnsupportedModelError


def configs(vocab: int) -> dict:
    from transformers import GPT2Config, GPTBigCodeConfig, GPTJConfig, GPTNeoXConfig

    return {
        # Pythia's layout: parallel attention and MLP, partial rotary
        "gpt_neox": GPTNeoXConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, rotary_pct=0.5, max_position_embeddings=256,
                                  use_parallel_residual=True, tie_word_embeddings=False),
        # learned absolute positions, Conv1D projections, tied head
        "gpt2": GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256),
        # interleaved rotary on part of each head
        "gptj": GPTJConfig(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256),
        # one K/V head (multi-query): its K rows reach the store as views torch calls contiguous (the walk: a crash)
        "gpt_bigcode": GPTBigCodeConfig(vocab_size=vocab, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                        multi_query=True),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    tmp = tmp_path_factory.mktemp("transformers-impl")
    return {name: save_random_model(config, tmp / name, tokenizer) for name, config in configs(len(tokenizer)).items()}


@pytest.mark.parametrize("family", ["gpt_neox", "gpt2", "gptj", "gpt_bigcode"])
def test_greedy_tokens_and_logprobs_equal_transformers(models, tokenizer, family):
    ours, _ = engine_outputs(models[family])  # --model-impl auto picks transformers for these
    assert_close(transformers_reference(models[family], tokenizer), ours)


def test_the_head_scales_logits_as_the_familys_forward_does(tmp_path, tokenizer):
    """Granite divides its logits by logits_scaling after the head, in its own forward: so does the path."""
    folder = save_random_model(granite_config(len(tokenizer)), tmp_path / "granite", tokenizer)
    ours, _ = engine_outputs(folder, model_impl="transformers")
    assert_close(transformers_reference(folder, tokenizer), ours)


def test_a_llama_through_transformers_equals_the_native_engine(tmp_path, tokenizer):
    from transformers import LlamaConfig

    folder = save_random_model(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
                               tmp_path / "llama", tokenizer)
    native, _ = engine_outputs(folder, model_impl="llmctl")
    through, _ = engine_outputs(folder, model_impl="transformers")
    for (tokens, sampled, prompt), (their_tokens, their_sampled, their_prompt) in zip(native, through):
        assert their_tokens == tokens
        assert max(abs(a - b) for a, b in zip(sampled + prompt, their_sampled + their_prompt)) < 1e-4


def test_an_architecture_neither_path_runs_says_which_were_tried(tmp_path, tokenizer):
    from transformers import FalconConfig

    folder = save_random_model(FalconConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=1,
                                            num_attention_heads=4), tmp_path / "falcon", tokenizer)
    with pytest.raises(UnsupportedModelError) as error:
        LLM(str(folder))
    message = str(error.value)
    assert "no native FalconForCausalLM" in message
    assert "--model-impl transformers: no attention-interface support in transformers for FalconForCausalLM" in message
    assert "\n" not in message


def test_transformers_impl_is_one_process(models):
    with pytest.raises(UnsupportedModelError, match="runs in one process"):
        LLM(str(models["gpt2"]), tensor_parallel_size=2)


def unservable_configs(vocab: int) -> dict:
    """Families whose layers the fallback cannot reproduce (each generated other tokens than transformers, or
    crashed, before they were refused): attention sinks, recurrent layers, chunked attention."""
    from transformers import (
        BertConfig,
        DiffLlamaConfig,
        Gemma4TextConfig,
        GptOssConfig,
        GraniteMoeHybridConfig,
        Llama4TextConfig,
    )

    small = dict(vocab_size=vocab, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    return {
        "gpt_oss": (GptOssConfig(**small, num_hidden_layers=2, head_dim=16, num_local_experts=4,
                                 num_experts_per_tok=2, sliding_window=8), "s_aux (attention sinks)"),
        "granitemoehybrid": (GraniteMoeHybridConfig(**small, num_hidden_layers=2, shared_intermediate_size=64,
                                                    num_local_experts=4, num_experts_per_tok=2,
                                                    layer_types=["mamba", "attention"], mamba_n_heads=4,
                                                    mamba_d_head=32, mamba_d_state=16, mamba_n_groups=1),
                             "layers [0] are"),
        "llama4_text": (Llama4TextConfig(**small, intermediate_size_mlp=64, num_hidden_layers=2, head_dim=16,
                                         num_local_experts=2, attention_chunk_size=8),
                        "chunked_attention"),
        # BertLMHeadModel without is_decoder: attention both ways (scripts/fallback_walk.py found it served wrongly)
        "bert": (BertConfig(vocab_size=vocab, hidden_size=64, intermediate_size=64, num_attention_heads=4,
                            num_hidden_layers=2, architectures=["BertLMHeadModel"]), "is bidirectional"),
        # differential attention: two attention calls per layer, each with half of V (also found by the walk)
        "diffllama": (DiffLlamaConfig(**small, num_hidden_layers=2), "more than once per step"),
        # Gemma 4: its full-attention layers' heads are larger than its sliding ones' (the walk: a crash mid-request)
        "gemma4_text": (Gemma4TextConfig(**small, num_hidden_layers=2, head_dim=16), "another count or size"),
    }


@pytest.mark.parametrize("family", ["gpt_oss", "granitemoehybrid", "llama4_text", "bert", "diffllama", "gemma4_text"])
def test_layers_the_fallback_cannot_reproduce_are_refused_by_layer(tmp_path, tokenizer, family):
    """Decided per layer from what the layers do (config layer_types, a one-token probe of the attention calls),
    not from a list of names: each of these loaded and answered wrongly (or crashed mid-request) before."""
    config, what = unservable_configs(len(tokenizer))[family]
    folder = save_random_model(config, tmp_path / family, tokenizer)
    with pytest.raises(UnsupportedModelError) as error:
        LLM(str(folder), max_model_len=64, kv_cache_memory=16 << 20, model_impl="transformers")  # gpt-oss: native too
    message = str(error.value)
    assert "--model-impl transformers:" in message and what in message, message
