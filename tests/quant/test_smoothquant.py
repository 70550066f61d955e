"""SmoothQuant (llmctl/quant/smoothquant.py) on a transformers Llama layer: the smoothed layer computes what the
original did (before rounding), and where an input channel carries an outlier — what SmoothQuant exists for —
W8A8 (compressed-tensors' own per-token and per-channel int8 fake quantization) errs less after smoothing."""

from __future__ import annotations

import copy

import torch

from llmctl.quant.smoothquant import smooth_layer


def llama_layer() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=1, vocab_size=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(config, 0).eval()
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.uniform_(0.5, 1.5)
    positions = torch.arange(16).unsqueeze(0)
    return layer, LlamaRotaryEmbedding(config)(torch.zeros(1), positions)


def run(layer: torch.nn.Module, hidden: torch.Tensor, rotary: tuple) -> torch.Tensor:
    with torch.no_grad():
        cos, sin = (t.expand(hidden.shape[0], -1, -1) for t in rotary)
        out = layer(hidden, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def smoothed(layer: torch.nn.Module, hidden: torch.Tensor, rotary: tuple) -> torch.nn.Module:
    copied = copy.deepcopy(layer)

    def capture(names, consume):
        hooks = [copied.get_submodule(name).register_forward_hook(
            lambda module, args, output, name=name: consume(name, args[0])) for name in names]
        run(copied, hidden, rotary)
        for hook in hooks:
            hook.remove()

    smooth_layer(copied, capture)
    return copied


def w8a8(layer: torch.nn.Module) -> torch.nn.Module:
    """Every linear's weight int8 per channel and its input int8 per token, by compressed-tensors."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams, compute_dynamic_scales_and_zp

    weights = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")
    tokens = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="token", dynamic=True)
    quantized = copy.deepcopy(layer)
    for linear in [m for m in quantized.modules() if isinstance(m, torch.nn.Linear)]:
        with torch.no_grad():
            w = linear.weight
            scale, zero = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), weights)
            linear.weight.copy_(fake_quantize(w, scale, zero, weights))

        def quantize_input(module, args):
            x = args[0]
            scale, zero = compute_dynamic_scales_and_zp(x, tokens, module)
            return (fake_quantize(x, scale, zero, tokens),)
        linear.register_forward_pre_hook(quantize_input)
    return quantized


def test_smoothing_leaves_the_layer_computing_what_it_did():
    layer, rotary = llama_layer()
    hidden = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(1))
    after = smoothed(layer, hidden, rotary)
    assert not torch.allclose(after.input_layernorm.weight, layer.input_layernorm.weight)
    torch.testing.assert_close(run(after, hidden, rotary), run(layer, hidden, rotary), rtol=1e-4, atol=1e-4)


def test_an_outlier_channel_costs_w8a8_less_once_smoothed():
    layer, rotary = llama_layer()
    with torch.no_grad():  # channel 5 of both norms' outputs 40× the others, as in the paper's models
        layer.input_layernorm.weight[5] = 40.0
        layer.post_attention_layernorm.weight[5] = 40.0
    hidden = torch.randn(4, 16, 128, generator=torch.Generator().manual_seed(2))
    reference = run(layer, hidden, rotary)
    plain = (run(w8a8(layer), hidden, rotary) - reference).pow(2).mean()
    smooth = (run(w8a8(smoothed(layer, hidden, rotary)), hidden, rotary) - reference).pow(2).mean()
    assert smooth < 0.5 * plain, (float(smooth), float(plain))
