"""GPTQ (Frantar et al., 2022): quantize columns one by one, pushing each column's error onto
the columns not yet quantized through the inverse Hessian of the layer's inputs."""

from __future__ import annotations

import torch

from llmctl.quant.formats import QuantizedWeight
from llmctl.quant.rtn import QuantConfig, group_params, quantize_values

BLOCK_SIZE = 128
DAMPING = 0.01


class HessianAccumulator:
    """H = 2 XᵀX / n over all calibration tokens seen by one linear layer."""

    def __init__(self, in_features: int) -> None:
        self.h = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.count = 0

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.reshape(-1, inputs.shape[-1]).to(torch.float64)
        self.h += x.t() @ x
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return (2.0 / max(self.count, 1)) * self.h


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, config: QuantConfig) -> QuantizedWeight:
    """weight [out, in]; returns the integers and group parameters (act-order off, as vLLM needs)."""
    w = weight.detach().to(torch.float64).clone()
    out_features, in_features = w.shape
    group = config.group_for(in_features)
    h = hessian.to(torch.float64).clone()
    dead = torch.diag(h) == 0  # inputs that never fire: any value works, so quantize them from zero
    h[dead, dead] = 1
    w[:, dead] = 0
    h += DAMPING * torch.mean(torch.diag(h)) * torch.eye(in_features, dtype=h.dtype)
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    q = torch.zeros_like(w)
    scales = torch.zeros(out_features, in_features // group, dtype=torch.float64)
    zeros = torch.zeros_like(scales)
    scale = zero = None
    for start in range(0, in_features, BLOCK_SIZE):
        end = min(start + BLOCK_SIZE, in_features)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        h_block = h_inv[start:end, start:end]
        for i in range(end - start):
            column = start + i
            if column % group == 0:  # group parameters from the weights as updated so far
                span = torch.cat([block[:, i:], w[:, end:]], dim=1)[:, :group]
                scale, zero = group_params(span, config)
                scales[:, column // group], zeros[:, column // group] = scale, zero
            values = quantize_values(block[:, i:i + 1], scale, zero, config.maxq).squeeze(1)
            q[:, column] = values
            dequantized = (values - zero) * scale
            error = (block[:, i] - dequantized) / h_block[i, i]
            block[:, i:] -= error.unsqueeze(1) @ h_block[i, i:].unsqueeze(0)
            errors[:, i] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    return QuantizedWeight(q.to(torch.int32), scales.float(), zeros.to(torch.int32), config.bits, group)
