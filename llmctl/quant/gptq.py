"""GPTQ (Frantar et al., 2022): quantize columns one by one, pushing each column's error onto
the columns not yet quantized through the inverse Hessian of the layer's inputs."""

from __future__ import annotations

import torch

from llmctl.checkpoint.quant_formats import QuantizedWeight
from llmctl.quant.rtn import QuantConfig, quantize_values, search_group_params

BLOCK_SIZE = 128
DAMPING = 0.01


class HessianAccumulator:
    """H = 2 XᵀX / n over all calibration tokens seen by one linear layer."""

    def __init__(self, in_features: int) -> None:
        self.h = torch.zeros(in_features, in_features, dtype=torch.float64)
        self.count = 0

    def add(self, inputs: torch.Tensor) -> None:
        x = inputs.reshape(-1, inputs.shape[-1]).float()
        self.h += (x.t() @ x).double()  # one batch's products in float32 (as GPTQ's reference), the sum in float64
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return (2.0 / max(self.count, 1)) * self.h


class LayerHessians:
    """One Hessian per distinct input of a layer's linears: q/k/v read one tensor and gate/up another, so
    their Hessians are one and the same, accumulated once. Linears called one after the other with the
    same tensor share (the same memory: a forward hook's `args[0].detach()` is a new object each call)."""

    def __init__(self) -> None:
        self.accumulators: dict[str, HessianAccumulator] = {}
        self.owner: dict[str, str] = {}  # linear -> the linear whose accumulator it reads
        self._last: tuple[str | None, torch.Tensor | None] = (None, None)

    def add(self, name: str, inputs: torch.Tensor) -> None:
        last_name, last_inputs = self._last
        if name not in self.owner:
            self.owner[name] = name
            if last_name is not None and last_inputs is not None and _same_tensor(last_inputs, inputs):
                self.owner[name] = self.owner[last_name]
        self._last = (name, inputs)
        if self.owner[name] == name:
            self.accumulators.setdefault(name, HessianAccumulator(inputs.shape[-1])).add(inputs)

    def hessian(self, name: str) -> torch.Tensor:
        return self.accumulators[self.owner[name]].hessian()


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Views of one memory (`_last` keeps `a` alive, so its address cannot be reused by another tensor)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, config: QuantConfig) -> QuantizedWeight:
    """weight [out, in]; returns the integers and group parameters in the original column order."""
    w = weight.detach().to(torch.float64).clone()
    out_features, in_features = w.shape
    group = config.group_for(in_features)
    h = hessian.to(torch.float64).clone()
    dead = torch.diag(h) == 0  # inputs that never fire: any value works, so quantize them from zero
    h[dead, dead] = 1
    w[:, dead] = 0
    groups = in_features // group
    scales = torch.zeros(out_features, groups, dtype=torch.float64)
    zeros = torch.zeros_like(scales)
    if config.act_order:
        # Static groups: parameters fixed up front from the weights as they are (the visiting
        # order below would otherwise split groups and need a permuted g_idx).
        # every group at once: the search is per row, and a group of a row is a row here
        scale, zero = search_group_params(w.reshape(out_features * groups, group), config)
        scales, zeros = scale.reshape(out_features, groups), zero.reshape(out_features, groups)
        order = torch.argsort(torch.diag(h), descending=True)
    else:
        order = torch.arange(in_features)
    w, h = w[:, order], h[order][:, order]
    h += DAMPING * torch.mean(torch.diag(h)) * torch.eye(in_features, dtype=h.dtype)
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    column_group = (order // group).tolist()  # the group of each visited column

    q = torch.zeros_like(w)
    for start in range(0, in_features, BLOCK_SIZE):
        end = min(start + BLOCK_SIZE, in_features)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        h_block = h_inv[start:end, start:end]
        for i in range(end - start):
            g = column_group[start + i]
            if not config.act_order and (start + i) % group == 0:  # from the weights as updated so far
                span = torch.cat([block[:, i:], w[:, end:]], dim=1)[:, :group]
                scales[:, g], zeros[:, g] = search_group_params(span, config)
            scale, zero = scales[:, g], zeros[:, g]
            values = quantize_values(block[:, i:i + 1], scale, zero, config.maxq).squeeze(1)
            q[:, start + i] = values
            error = (block[:, i] - (values - zero) * scale) / h_block[i, i]
            block[:, i:].addr_(error, h_block[i, i:], alpha=-1)  # the error pushed onto the columns after i
            errors[:, i] = error
        w[:, end:] -= errors @ h_inv[start:end, end:]
    q = q[:, torch.argsort(order)]
    return QuantizedWeight(q.to(torch.int32), scales.float(), zeros.to(torch.int32), config.bits, group)
