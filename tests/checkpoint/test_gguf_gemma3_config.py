"""Gemma 3 GGUF metadata read as llama.cpp runs the file, checked against Google's published configs:
transformers' GGUF reader leaves the linear RoPE scaling of the global layers and the 27B's query scale
at its defaults, so a Gemma 3 4B-27B file would run with the wrong positions or softmax scale."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFWriter, RopeScalingType

from llmctl.checkpoint.gguf_architectures import transformers_config

# google/gemma-3-4b-it and google/gemma-3-27b-it, config.json's text_config (published on the hub)
GEMMA3_4B = dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, sliding_window=1024, query_pre_attn_scalar=256, factor=8.0)
GEMMA3_27B = dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                  num_key_value_heads=16, head_dim=128, sliding_window=1024, query_pre_attn_scalar=168, factor=8.0)


def _write_metadata_only(path: Path, published: dict) -> None:
    """The keys llama.cpp's convert_hf_to_gguf.py (Gemma3Model.set_gguf_parameters) writes for this model."""
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_context_length(131072)
    writer.add_embedding_length(published["hidden_size"])
    writer.add_block_count(published["num_hidden_layers"])
    writer.add_feed_forward_length(published["intermediate_size"])
    writer.add_head_count(published["num_attention_heads"])
    writer.add_head_count_kv(published["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_key_length(published["head_dim"])
    writer.add_value_length(published["head_dim"])
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_sliding_window(published["sliding_window"])
    writer.add_rope_scaling_type(RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(published["factor"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("published", [GEMMA3_4B, GEMMA3_27B], ids=["4b", "27b"])
def test_gemma3_gguf_config_matches_the_published_config(published, tmp_path):
    import gguf

    path = tmp_path / "gemma3.gguf"
    _write_metadata_only(path, published)
    meta = {key: field.contents() for key, field in gguf.GGUFReader(str(path)).fields.items()}
    config = transformers_config(path, has_output_tensor=False, arch="gemma3", meta=meta)
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["head_dim"] == published["head_dim"]
    assert config["query_pre_attn_scalar"] == published["query_pre_attn_scalar"]
    assert config["sliding_window"] == published["sliding_window"]
    rope = config["rope_parameters"]
    assert rope["full_attention"] == {"rope_type": "linear", "factor": published["factor"], "rope_theta": 1_000_000.0}
    assert rope["sliding_attention"]["rope_theta"] == 10_000.0 and rope["sliding_attention"]["rope_type"] == "default"
    kinds = config["layer_types"]
    assert [i for i, kind in enumerate(kinds) if kind == "full_attention"] == list(range(5, len(kinds), 6))
