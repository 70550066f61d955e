"""A W8A8 / FP8-dynamic mixture of experts' routed experts quantize each projection's input per token, as vLLM's
compressed-tensors MoE methods do: FusedMoE (the CPU grouped path and the fused-MoE kernel's torch stages, in
Triton's interpreter) against per-expert nn.Linear modules that compressed-tensors itself quantizes
(`apply_quantization_config` with the checkpoint's input-activation args, its own forward wrapper)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers.moe import FusedMoE, Routing, route

EXPERTS, HIDDEN, INTERMEDIATE = 4, 32, 64
SCHEMES = {"int8": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True, "symmetric": True},
           "fp8": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}}


def reference_experts(w13: torch.Tensor, w2: torch.Tensor, activations: dict) -> list[nn.ModuleDict]:
    """Each expert as three nn.Linear modules under compressed-tensors' dynamic input quantization."""
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    experts = []
    for e in range(EXPERTS):
        gate, up = (nn.Linear(HIDDEN, INTERMEDIATE, bias=False) for _ in range(2))
        down = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)
        with torch.no_grad():
            gate.weight.copy_(w13[e, :INTERMEDIATE])
            up.weight.copy_(w13[e, INTERMEDIATE:])
            down.weight.copy_(w2[e])
        expert = nn.ModuleDict({"gate": gate, "up": up, "down": down})
        config = QuantizationConfig.model_validate({"config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": activations}}, "quantization_status": "frozen"})
        apply_quantization_config(expert, config)
        experts.append(expert)
    return experts


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("kernel", ["cpu", "fused"])
def test_experts_quantize_each_projection_input_per_token(scheme, kernel):
    torch.manual_seed(0)
    routing = Routing(top_k=2, renormalize=True)
    layer = FusedMoE(EXPERTS, HIDDEN, INTERMEDIATE, routing, TPGroup(), activations=SCHEMES[scheme])
    # weights and inputs on small dyadic grids: every product and sum is exact in float32, in any order and batch,
    # so no quantization step can round differently here than in the reference (only the scheme is compared)
    with torch.no_grad():
        layer.w13.copy_(torch.randint(-3, 4, layer.w13.shape) / 8)
        layer.w2.copy_(torch.randint(-3, 4, layer.w2.shape) / 8)
    x, logits = torch.randint(-4, 5, (9, HIDDEN)) / 4, torch.randn(9, EXPERTS)
    experts = reference_experts(layer.w13, layer.w2, SCHEMES[scheme])
    weights, ids = route(logits, routing)
    expected = torch.zeros_like(x)
    with torch.no_grad():
        for token in range(x.shape[0]):
            for weight, e in zip(weights[token], ids[token].tolist()):
                row, expert = x[token:token + 1], experts[e]
                hidden = nn.functional.silu(expert["gate"](row)) * expert["up"](row)
                expected[token] += weight * expert["down"](hidden)[0]
        if kernel == "fused":  # the CUDA path's stages: Triton's grouped GEMM (interpreted) between torch ops
            from llmctl.kernels.fused_moe import fused_moe

            out = fused_moe(x, weights, ids, layer.w13, layer.w2, 0, layer._quantized)
        else:
            out = layer(x, logits)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    unquantized = FusedMoE(EXPERTS, HIDDEN, INTERMEDIATE, routing, TPGroup())
    with torch.no_grad():
        unquantized.w13.copy_(layer.w13)
        unquantized.w2.copy_(layer.w2)
        assert (unquantized(x, logits) - expected).abs().max() > 1e-2  # the quantization is visible at this size
