"""Layer-by-layer GPTQ and AWQ on a small random Llama: formats, shapes, and error against the original."""

from __future__ import annotations

import pytest
import torch

from llmctl.errors import LlmctlError
from llmctl.quant.evaluate import load_dense_model
from llmctl.quant.pipeline import check_supported, quantize_model
from llmctl.quant.rtn import QuantConfig


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def output_error(folder, state, calibration) -> float:
    reference = load_dense_model(folder)(calibration).logits
    return float((load_dense_model(folder, state)(calibration).logits - reference).pow(2).mean())


@pytest.mark.parametrize("method, symmetric", [("gptq", True), ("awq", False)])
def test_quantize_tiny_llama(tiny_llama, method, symmetric):
    torch.manual_seed(1)
    calibration = torch.randint(0, 512, (8, 32))
    config = QuantConfig(bits=4, group_size=32, symmetric=symmetric)
    done = []
    result = quantize_model(tiny_llama, method, config, calibration, on_layer=lambda i, n: done.append((i, n)))
    assert done == [(1, 2), (2, 2)]
    t = result.tensors
    if method == "gptq":
        assert t["model.layers.0.self_attn.q_proj.qweight"].shape == (64 // 8, 64)
        assert t["model.layers.0.mlp.down_proj.qzeros"].shape == (128 // 32, 64 // 8)
        assert t["model.layers.0.mlp.down_proj.g_idx"].dtype == torch.int32
    else:
        assert t["model.layers.0.self_attn.q_proj.qweight"].shape == (64, 64 // 8)
        assert t["model.layers.0.mlp.down_proj.qzeros"].shape == (128 // 32, 64 // 8)
    assert t["model.layers.1.mlp.down_proj.scales"].dtype == torch.float16
    assert "model.layers.0.self_attn.q_proj.weight" not in t
    assert "model.layers.0.input_layernorm.weight" in t and "model.embed_tokens.weight" in t
    assert set(result.dequantized) >= {"model.layers.1.mlp.down_proj.weight", "model.norm.weight"}


def test_gptq_beats_round_to_nearest_on_the_model_output(tiny_llama):
    torch.manual_seed(2)
    calibration = torch.randint(0, 512, (8, 32))
    config = QuantConfig(bits=4, group_size=32, symmetric=True)
    gptq = quantize_model(tiny_llama, "gptq", config, calibration)
    rtn = quantize_model(tiny_llama, "rtn", config, calibration)
    assert output_error(tiny_llama, gptq.dequantized, calibration) < \
        output_error(tiny_llama, rtn.dequantized, calibration)


def test_group_size_that_does_not_divide_names_sizes_that_work():
    from transformers import LlamaConfig

    smol = LlamaConfig(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    with pytest.raises(LlmctlError, match="group size 128 does not divide the hidden size 576.*use --group-size "
                                          "32 or 64"):
        check_supported(smol, QuantConfig(group_size=128))


def test_linears_reading_one_input_share_one_hessian():
    """q/k/v (and gate/up) read one tensor: through the forward hooks quantize registers on a transformers Llama
    layer, their Hessian is accumulated once, and equals the one accumulated from that input alone."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    from llmctl.quant.gptq import HessianAccumulator, LayerHessians
    from llmctl.quant.pipeline import _capture_inputs, _layer_runner

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    layer, positions = LlamaDecoderLayer(config, 0).eval(), torch.arange(6).unsqueeze(0)
    run = _layer_runner(layer, LlamaRotaryEmbedding(config)(torch.zeros(1), positions), positions, None)
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")
    hessians, alone = LayerHessians(), HessianAccumulator(32)
    hidden = torch.randn(16, 6, 32)  # two calibration batches of 8
    _capture_inputs(layer, hidden, run, names, hessians.add)
    _capture_inputs(layer, hidden, run, ("self_attn.k_proj",), lambda _, inputs: alone.add(inputs))
    assert hessians.owner == {"self_attn.q_proj": "self_attn.q_proj", "self_attn.k_proj": "self_attn.q_proj",
                              "self_attn.v_proj": "self_attn.q_proj", "self_attn.o_proj": "self_attn.o_proj",
                              "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.gate_proj",
                              "mlp.down_proj": "mlp.down_proj"}
    assert set(hessians.accumulators) == {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"}
    assert torch.equal(hessians.hessian("self_attn.v_proj"), alone.hessian())
