"""The last stage's pooler: each finished prompt's rows of hidden states → one vector (or, ALL, one per token),
through the classifier's score head where there is one. Normalization, Matryoshka cuts and activations are per
request and happen on the driver (llmctl.engine.pooling.outputs)."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.engine.pooling.config import PoolerConfig


def adapt_for_pooling(model: nn.Module, config: PoolerConfig, last_stage: bool) -> None:
    """Drop the LM head (a pooling checkpoint has none to load) and, for a classifier, add its score head."""
    model.lm_head = None  # type: ignore[assignment]
    if config.task == "classify" and last_stage:  # transformers' ...ForSequenceClassification: `score`, no bias
        model.score = nn.Linear(config.hidden_size, config.labels, bias=False)


def pool(model: nn.Module, config: PoolerConfig, hidden: torch.Tensor,
         spans: dict[int, tuple[int, int]]) -> dict[int, torch.Tensor]:
    """seq_id → its pooled output, float32 on the host; `spans` are each sequence's rows (first, end) in hidden."""
    if not spans:
        return {}
    ids = list(spans)
    if config.pooling == "ALL":
        return {seq_id: hidden[start:end].float().cpu() for seq_id, (start, end) in spans.items()}
    if config.pooling == "MEAN":
        pooled = torch.stack([hidden[start:end].float().mean(dim=0) for start, end in spans.values()])
    else:  # LAST or CLS: one row each, gathered at once
        rows = [end - 1 if config.pooling == "LAST" else start for start, end in spans.values()]
        pooled = hidden[torch.tensor(rows, device=hidden.device)].float()
    if config.task == "classify":
        score = model.get_submodule("score")  # an nn.Linear, or the CPU loader's packed form of it
        pooled = score(pooled.to(hidden.dtype)).float()
    return dict(zip(ids, pooled.cpu()))
