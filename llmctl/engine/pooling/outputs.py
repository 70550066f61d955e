"""A pooled output made final for its request, on the driver: the Matryoshka cut and L2 normalization of
embeddings (the cut first, as vLLM), the activation of classifier scores (softmax over labels; sigmoid for one)."""

from __future__ import annotations

import torch

from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams


def finish_pooled(raw: torch.Tensor, config: PoolerConfig, params: PoolingParams) -> torch.Tensor:
    if config.task == "embed":
        vector = raw[: params.dimensions] if params.dimensions is not None else raw
        normalize = config.normalize if params.normalize is None else params.normalize
        return torch.nn.functional.normalize(vector, p=2, dim=-1) if normalize else vector
    if config.task == "classify" and params.use_activation is not False:
        return torch.sigmoid(raw) if raw.shape[-1] == 1 else torch.softmax(raw, dim=-1)
    return raw
