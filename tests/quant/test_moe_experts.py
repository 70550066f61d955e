"""GPTQ expert by expert on a transformers Qwen3-MoE layer: each expert weighed by the tokens the router sent it
errs less than rounding to nearest on those tokens, and an expert no token reached is rounded to nearest."""

from __future__ import annotations

import torch

from llmctl.quant.moe_experts import QWEN_NAMES, quantize_experts
from llmctl.quant.rtn import QuantConfig, rtn_quantize


def _layer(experts: int = 4):
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=64, num_experts=experts, num_experts_per_tok=2)
    block = Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0, 0.2)
    return torch.nn.ModuleDict({"mlp": block})


def _run(layer):
    def run(hidden: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = layer.mlp(hidden)
        return out[0] if isinstance(out, tuple) else out
    return run


def test_gptq_experts_err_less_than_rounding_on_their_tokens():
    config = QuantConfig(bits=4, group_size=32, symmetric=True)
    layer = _layer()
    hidden = torch.randn(8, 32, 64) * torch.linspace(0.2, 3, 64)  # uneven channels: where GPTQ's weighting pays
    exact = _run(layer)(hidden)
    original = {name: p.detach().clone() for name, p in layer.mlp.experts.named_parameters()}
    quantized = quantize_experts(layer, hidden, _run(layer), config, QWEN_NAMES, batch=4)
    assert set(quantized) == {f"mlp.experts.{e}.{p}" for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")}
    gptq_error = (_run(layer)(hidden) - exact).pow(2).mean()
    with torch.no_grad():  # the same experts rounded to nearest
        for e in range(4):
            gate_up, down = original["gate_up_proj"][e], original["down_proj"][e]
            layer.mlp.experts.gate_up_proj[e].copy_(rtn_quantize(gate_up, config).dequantize())
            layer.mlp.experts.down_proj[e].copy_(rtn_quantize(down, config).dequantize())
    rtn_error = (_run(layer)(hidden) - exact).pow(2).mean()
    print(f"GPTQ {gptq_error:.3g}, RTN {rtn_error:.3g}")
    assert gptq_error < 0.8 * rtn_error, (gptq_error, rtn_error)


def test_an_expert_no_token_reached_is_rounded_to_nearest():
    config = QuantConfig(bits=4, group_size=32, symmetric=True)
    layer = _layer()
    with torch.no_grad():
        layer.mlp.gate.weight[3] = -100.0  # on positive inputs the router never picks expert 3
    down = layer.mlp.experts.down_proj[3].detach().clone()
    quantized = quantize_experts(layer, torch.rand(4, 16, 64), _run(layer), config, QWEN_NAMES, batch=4)
    torch.testing.assert_close(quantized["mlp.experts.3.down_proj"].dequantize(), rtn_quantize(down, config).dequantize())
