"""ModelSpec facts and parameter/KV oracles from published model facts and real hub configs."""

from __future__ import annotations

import json

import pytest

from helpers.hubcache import HUB_FIXTURES
from llmctl.checkpoint.params import count_from_config
from llmctl.checkpoint.spec import ModelSpec


def fixture_spec(repo_id: str) -> ModelSpec:
    return ModelSpec.from_config(json.loads((HUB_FIXTURES / repo_id / "config.json").read_text()))


def index_total(repo_id: str) -> int:
    return json.loads((HUB_FIXTURES / repo_id / "model.safetensors.index.json").read_text())["metadata"]["total_size"]


# Configs written from the models' published config.json values (not in the fixtures).
LLAMA_31_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "torch_dtype": "bfloat16",
}
LLAMA_2_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 4096, "torch_dtype": "float16",
}
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0, "sliding_window": 131072,
    "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
QWEN25_14B = {**QWEN25_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
              "num_attention_heads": 40, "num_key_value_heads": 8}


def test_bloom_176b_params_and_kv() -> None:
    spec = fixture_spec("bigscience/bloom")
    count = count_from_config(spec)
    assert count is not None and count.total == 176_247_271_424
    assert index_total("bigscience/bloom") == 2 * count.total  # bf16 shards hold exactly these params
    assert spec.kv_bytes_per_token(2) == 4_014_080
    assert spec.positional.kind == "alibi"
    assert spec.attention.kind == "MHA" and spec.attention.num_heads == 112
    assert spec.layout.embedding_norm and spec.tie_word_embeddings


def test_llama_31_70b_params_kv_and_rope_scaling() -> None:
    spec = ModelSpec.from_config(LLAMA_31_70B)
    assert count_from_config(spec).total == 70_553_706_496
    assert spec.kv_bytes_per_token(2) == 327_680
    rope = spec.positional.rope
    assert rope.scaling_type == "llama3" and rope.scaling_factor == 8.0 and rope.original_max_position == 8192
    assert spec.attention.kind == "GQA" and spec.max_context == 131072


def test_llama_2_70b_kv() -> None:
    assert ModelSpec.from_config(LLAMA_2_70B).kv_bytes_per_token(2) == 327_680


def test_qwen25_params_and_kv() -> None:
    spec = ModelSpec.from_config(QWEN25_7B)
    assert count_from_config(spec).total == 7_615_616_512
    assert spec.kv_bytes_per_token(2) == 57_344
    assert spec.layout.qkv_bias and not spec.layout.o_bias
    assert spec.attention.sliding_window is None  # use_sliding_window is false
    assert ModelSpec.from_config(QWEN25_14B).kv_bytes_per_token(2) == 196_608


def test_mixtral_total_and_active() -> None:
    spec = fixture_spec("mistralai/Mixtral-8x7B-v0.1")
    count = count_from_config(spec)
    assert count.total == 46_702_792_704
    assert count.active == 12_879_925_248
    assert index_total("mistralai/Mixtral-8x7B-v0.1") == 2 * count.total
    assert spec.kv_bytes_per_token(2) == 131_072
    assert spec.moe.num_experts == 8 and spec.moe.top_k == 2


def test_llama2_7b_index_holds_params_plus_rotary_buffers() -> None:
    spec = fixture_spec("meta-llama/Llama-2-7b-hf")
    count = count_from_config(spec).total
    assert count == 6_738_415_616
    # the old checkpoint also stores 32 layers x 64 float32 rotary inv_freq values
    assert index_total("meta-llama/Llama-2-7b-hf") == 2 * count + 32 * 64 * 4


def test_qwen1_remote_code_config() -> None:
    spec = fixture_spec("Qwen/Qwen-72B")
    assert spec.model_type == "qwen" and spec.requires_remote_code
    assert spec.attention.num_kv_heads == 64 and spec.attention.head_dim == 128
    assert spec.max_context == 8192 and spec.positional.rope.theta == 1_000_000
    assert index_total("Qwen/Qwen-72B") == 2 * count_from_config(spec).total


def test_deepseek_mla_moe_fp8() -> None:
    spec = fixture_spec("deepseek-ai/DeepSeek-R1")
    att = spec.attention
    assert att.kind == "MLA" and att.kv_lora_rank == 512 and att.qk_rope_head_dim == 64 and att.q_lora_rank == 1536
    assert spec.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
    assert spec.moe.num_experts == 256 and spec.moe.top_k == 8 and spec.moe.num_shared_experts == 1
    assert spec.moe.dense_layers == (0, 1, 2)
    assert spec.quantization.method == "fp8" and spec.quantization.details["weight_block_size"] == [128, 128]
    assert spec.positional.rope.scaling_type == "yarn" and spec.positional.rope.scaling_factor == 40
    count = count_from_config(spec)
    # DeepSeek publishes 671B main-model parameters, 37B activated, plus a ~14B MTP module (685B in all)
    assert 671e9 <= count.total < 672e9 and 37e9 <= count.active < 38e9
    assert 684e9 <= count.total + count.mtp < 685e9
    assert not spec.requires_remote_code  # transformers implements deepseek_v3 natively


def test_gptq_quantization_config() -> None:
    spec = fixture_spec("TheBloke/Llama-2-13B-chat-GPTQ")
    assert spec.quantization.method == "gptq" and spec.quantization.bits == 4 and spec.quantization.group_size == 128
    assert spec.quantization.details["desc_act"] is False


PUBLISHED = [
    # (config from the published config.json, published parameter count)
    ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
      "n_embd": 768, "n_layer": 12, "n_head": 12}, 124_439_808),
    ({"architectures": ["OPTForCausalLM"], "model_type": "opt", "vocab_size": 50272, "hidden_size": 768,
      "num_hidden_layers": 12, "num_attention_heads": 12, "ffn_dim": 3072, "max_position_embeddings": 2048,
      "word_embed_proj_dim": 768, "do_layer_norm_before": True}, 125_239_296),
    ({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 768,
      "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "rotary_pct": 0.25,
      "max_position_embeddings": 2048, "tie_word_embeddings": False}, 162_322_944),
    ({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "vocab_size": 65024, "hidden_size": 4544,
      "num_hidden_layers": 32, "num_attention_heads": 71, "multi_query": True, "parallel_attn": True,
      "bias": False, "alibi": False, "new_decoder_architecture": False}, 6_921_720_704),
    ({"architectures": ["PhiForCausalLM"], "model_type": "phi", "vocab_size": 51200, "hidden_size": 2560,
      "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 10240,
      "partial_rotary_factor": 0.4, "max_position_embeddings": 2048, "tie_word_embeddings": False}, 2_779_683_840),
    ({"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": 256000, "hidden_size": 3072,
      "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
      "intermediate_size": 24576, "max_position_embeddings": 8192}, 8_537_680_896),
    ({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584,
      "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
      "intermediate_size": 14336, "max_position_embeddings": 8192, "sliding_window": 4096}, 9_241_705_984),
    ({"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 151936,
      "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
      "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
      "num_experts": 60, "num_experts_per_tok": 4, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "max_position_embeddings": 8192, "tie_word_embeddings": False}, 14_315_784_192),
]


@pytest.mark.parametrize("config, published", PUBLISHED, ids=[c["model_type"] for c, _ in PUBLISHED])
def test_published_parameter_counts(config: dict, published: int) -> None:
    spec = ModelSpec.from_config(config)
    assert not spec.warnings
    assert count_from_config(spec).total == published


def test_family_facts() -> None:
    gpt2 = ModelSpec.from_config(PUBLISHED[0][0])
    assert gpt2.positional.kind == "learned" and gpt2.positional.learned_positions == 1024 and gpt2.tie_word_embeddings
    opt = ModelSpec.from_config(PUBLISHED[1][0])
    assert opt.positional.learned_positions == 2050  # OPT's offset of 2
    neox = ModelSpec.from_config(PUBLISHED[2][0])
    assert neox.positional.rope.partial_rotary_factor == 0.25 and neox.layout.parallel_residual
    falcon = ModelSpec.from_config(PUBLISHED[3][0])
    assert falcon.attention.kind == "MQA" and falcon.attention.num_kv_heads == 1
    phi = ModelSpec.from_config(PUBLISHED[4][0])
    assert phi.positional.rope.partial_rotary_factor == 0.4 and phi.layout.lm_head_bias
    gemma2 = ModelSpec.from_config(PUBLISHED[6][0])
    assert gemma2.attention.sliding_window == 4096 and gemma2.attention.layer_types[:2] == ("sliding", "full")
    moe = ModelSpec.from_config(PUBLISHED[7][0])
    assert moe.moe.num_shared_experts == 1 and moe.moe.shared_expert_gate
    assert round(count_from_config(moe).active / 1e8) == 27  # "A2.7B"


def test_mistral_sliding_window_and_falcon_alibi() -> None:
    mistral = ModelSpec.from_config({"model_type": "mistral", "architectures": ["MistralForCausalLM"],
                                     "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                                     "max_position_embeddings": 32768, "sliding_window": 4096})
    assert mistral.attention.sliding_window == 4096 and mistral.attention.sliding_layers == 32
    falcon = ModelSpec.from_config({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "alibi": True, "vocab_size": 100})
    assert falcon.positional.kind == "alibi"


def test_gemma3_multimodal_uses_text_config() -> None:
    spec = ModelSpec.from_config({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "intermediate_size": 10240, "vocab_size": 262208, "max_position_embeddings": 131072,
                        "sliding_window": 1024, "rope_theta": 1000000.0,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
    })
    assert spec.num_layers == 34 and spec.attention.qk_norm and spec.attention.kind == "GQA"
    assert spec.attention.layer_types[:6] == ("sliding",) * 5 + ("full",)
    assert spec.positional.rope.scaling_type == "linear" and spec.tie_word_embeddings
    assert any("text_config" in note for note in spec.notes)


def test_gemma3_rope_bases_for_full_and_sliding_layers() -> None:
    """Gemma 3's two RoPE bases, as published (rope_local_base_freq) and as transformers 5 saves them."""
    shape = {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
             "vocab_size": 100, "intermediate_size": 128, "sliding_window": 16}
    published = ModelSpec.from_config({**shape, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                                       "rope_scaling": {"factor": 8.0, "rope_type": "linear"}})
    saved = ModelSpec.from_config({**shape, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})
    for spec in (published, saved):
        rope = spec.positional.rope
        assert (rope.theta, rope.sliding_theta, rope.scaling_type, rope.scaling_factor) == (1e6, 1e4, "linear", 8.0)
        assert spec.positional.describe() == "RoPE θ=1e+06, linear scaling ×8; sliding layers θ=10000"


def test_transformers5_rope_parameters() -> None:
    spec = ModelSpec.from_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 128,
                                  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 4096}})
    assert spec.positional.rope.theta == 500000.0
    assert spec.positional.rope.scaling_type == "yarn" and spec.positional.rope.scaling_factor == 4.0


def test_unknown_architecture_is_best_effort_with_named_gaps() -> None:
    spec = ModelSpec.from_config({"model_type": "mystery", "architectures": ["MysteryForCausalLM"],
                                  "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000})
    assert spec.hidden_size == 256 and spec.num_layers == 0
    text = " ".join(spec.warnings)
    assert "mystery" in text and "num_layers" in text and "intermediate_size" in text
    assert count_from_config(spec) is None


def test_structure_from_architecture() -> None:
    bloom = fixture_spec("bigscience/bloom")
    assert bloom.structure == "decoder-only"
    t5 = ModelSpec.from_config({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
                                "is_encoder_decoder": True, "d_model": 512, "num_layers": 6, "num_heads": 8,
                                "vocab_size": 32128})
    assert t5.structure == "encoder-decoder"
