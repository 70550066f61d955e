"""A pooled output made final for its request, on the driver: the Matryoshka cut and L2 normalization of
embeddings (the cut first, as vLLM), STEP pooling's rows and columns, the activation of classifier and reward-head
scores (softmax over labels; sigmoid for one)."""

from __future__ import annotations

import torch

from llmctl.engine.pooling.config import PoolerConfig
from llmctl.engine.pooling.params import PoolingParams


def finish_pooled(raw: torch.Tensor, config: PoolerConfig, params: PoolingParams,
                  prompt_token_ids: list[int]) -> torch.Tensor:
    if config.task == "embed":
        vector = raw[: params.dimensions] if params.dimensions is not None else raw
        normalize = config.normalize if params.normalize is None else params.normalize
        return torch.nn.functional.normalize(vector, p=2, dim=-1) if normalize else vector
    if config.pooling == "STEP":
        raw = step_rows(raw, config, prompt_token_ids)
    activate = config.activates if params.use_activation is None else params.use_activation
    if config.task in ("classify", "reward") and activate and (config.task == "classify" or config.labels):
        return torch.sigmoid(raw) if raw.shape[-1] == 1 else torch.softmax(raw, dim=-1)
    return raw


def step_rows(rows: torch.Tensor, config: PoolerConfig, prompt_token_ids: list[int]) -> torch.Tensor:
    """vLLM's STEP pooling: the returned_token_ids columns of each row, then the rows of the step tag token."""
    if config.returned_token_ids:
        rows = rows[:, list(config.returned_token_ids)]
    if config.step_tag_id is not None:
        rows = rows[torch.tensor(prompt_token_ids) == config.step_tag_id]
    return rows
