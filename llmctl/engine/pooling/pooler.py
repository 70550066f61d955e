"""The last stage's pooler: each finished prompt's rows of hidden states → one vector (or, ALL and STEP, one
per token), through the classifier's or reward model's score head where there is one. Normalization, Matryoshka cuts and activations are per
request and happen on the driver (llmctl.engine.pooling.outputs)."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.pooling.config import PoolerConfig


class TokenRowsHead(nn.Module):
    """A classifier head made of LM-head rows (vLLM's classifier_from_token), loaded from the checkpoint's
    lm_head (or tied embedding) rows of those tokens alone: two give one label, the second minus the first."""

    def __init__(self, token_ids: tuple[int, ...], hidden_size: int) -> None:
        super().__init__()
        self.token_ids = token_ids
        self.weight = nn.Parameter(torch.empty(1 if len(token_ids) == 2 else len(token_ids), hidden_size),
                                   requires_grad=False)

    def expected(self) -> set[tuple[str, int]]:
        return {("weight", 0)}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        rows = torch.cat([tensor.read(0, token, token + 1) for token in self.token_ids])
        with torch.no_grad():
            self.weight.copy_(rows[1:] - rows[:1] if len(self.token_ids) == 2 else rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


def adapt_for_pooling(model: nn.Module, config: PoolerConfig, last_stage: bool) -> None:
    """Drop the LM head (a pooling checkpoint has none to load) and, for a classifier, add its score head: a
    transformers ...ForSequenceClassification's `score` (no bias), or one made of LM-head rows, which then
    takes the LM head's place in loading."""
    model.lm_head = None  # type: ignore[assignment]
    if config.task == "reward" and config.labels and last_stage:  # REWARD_HEADS: score.0, ReLU, score.2
        model.score = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.ReLU(),
                                    nn.Linear(config.hidden_size, config.labels))
    if config.task != "classify" or not last_stage:
        return
    if config.token_ids:
        model.lm_head = model.score = TokenRowsHead(config.token_ids, config.hidden_size)
    else:
        model.score = nn.Linear(config.hidden_size, config.labels, bias=False)


def pool(model: nn.Module, config: PoolerConfig, hidden: torch.Tensor,
         spans: dict[int, tuple[int, int]]) -> dict[int, torch.Tensor]:
    """seq_id → its pooled output, float32 on the host; `spans` are each sequence's rows (first, end) in hidden."""
    if not spans:
        return {}
    ids = list(spans)
    if config.pooling in ("ALL", "STEP"):  # every row (STEP's are picked on the driver, where the prompt is)
        parts = {seq_id: hidden[start:end] for seq_id, (start, end) in spans.items()}
        if config.labels:  # a reward model's score head, on every row
            score = model.get_submodule("score")
            parts = {seq_id: score(part) for seq_id, part in parts.items()}
        return {seq_id: part.float().cpu() for seq_id, part in parts.items()}
    if config.pooling == "MEAN":
        pooled = torch.stack([hidden[start:end].float().mean(dim=0) for start, end in spans.values()])
    else:  # LAST or CLS: one row each, gathered at once
        rows = [end - 1 if config.pooling == "LAST" else start for start, end in spans.values()]
        pooled = hidden[torch.tensor(rows, device=hidden.device)].float()
    if config.task == "classify":
        score = model.get_submodule("score")  # an nn.Linear, or the CPU loader's packed form of it
        pooled = score(pooled.to(hidden.dtype)).float()
    return dict(zip(ids, pooled.cpu()))
