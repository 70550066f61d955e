"""M-RoPE's cos and sin against transformers' own rotary embeddings: Qwen2-VL's sections and Qwen3-VL's
interleaved frequencies, for (t, h, w) positions that differ in every row."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_cos_and_sin_match_transformers(family):
    from transformers import Qwen2VLConfig, Qwen3VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from llmctl.engine.layers.positions import MRotaryEmbedding

    rope = {"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1_000_000.0}
    settings = dict(hidden_size=1024, num_attention_heads=8, head_dim=128, rope_parameters=rope)
    if family == "qwen2_vl":
        text = Qwen2VLConfig(text_config=settings).text_config
        reference = Qwen2VLRotaryEmbedding(text)
    else:
        text = Qwen3VLConfig(text_config={**settings, "rope_parameters": {**rope, "mrope_interleaved": True}}).text_config
        reference = Qwen3VLTextRotaryEmbedding(text)

    positions = torch.stack([torch.arange(40), torch.arange(40) * 3 % 17, torch.arange(40) * 7 % 23])
    ours = MRotaryEmbedding(text, 128, interleaved=family == "qwen3_vl")
    cos, sin = ours.cos_sin(positions, torch.float32, None)
    expected_cos, expected_sin = reference(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    torch.testing.assert_close(cos[:, 0], expected_cos[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin[:, 0], expected_sin[0], atol=1e-5, rtol=1e-5)
