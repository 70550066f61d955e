"""LLM's pooling calls (vLLM's offline API): embed, encode, classify and score, on an encoder served through
transformers (LLM.encoder) or a pooling model on the paged engine."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from typing import TYPE_CHECKING, Any

import torch

from llmctl.engine.front.embedding import EmbeddingModel, dimensions_problem
from llmctl.engine.front.encoder_classifier import EncoderClassifier
from llmctl.engine.front.prompt_lists import per_prompt, text_prompts
from llmctl.engine.pooling.params import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingParams,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from llmctl.engine.pooling.scoring import Pair, cosine_scores, pair_texts

if TYPE_CHECKING:
    from llmctl.engine.front.llm_engine import LLMEngine

Prompts = str | list[int] | Sequence[str | list[int]]


class PoolingCalls:
    encoder: EmbeddingModel | EncoderClassifier | None
    _ids: count

    @property
    def engine(self) -> LLMEngine:
        raise NotImplementedError

    def _run(self, batch: list[Any], params_list: list[Any], loras: list[Any]) -> list[Any]:
        raise NotImplementedError

    def embed(self, prompts: Prompts, pooling_params: PoolingParams | None = None) -> list[EmbeddingRequestOutput]:
        """vLLM's LLM.embed: one embedding per prompt, in order."""
        batch = text_prompts(prompts)
        if isinstance(self.encoder, EmbeddingModel):
            dimensions = (pooling_params or PoolingParams()).dimensions
            if dimensions is not None and (problem := dimensions_problem(self.encoder.pooling,
                                                                          self.encoder.spec.hidden_size, dimensions)):
                raise ValueError(problem)
            vectors, _ = self.encoder.embed(batch, dimensions)
            return [EmbeddingRequestOutput(str(next(self._ids)), self.encoder.token_ids(prompt),
                                           EmbeddingOutput(vector.tolist())) for prompt, vector in zip(batch, vectors)]
        self._require_task("embed", "LLM.embed")
        return [EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.outputs.data.tolist()))
                for o in self.encode(batch, pooling_params)]

    def encode(self, prompts: Prompts,
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None) -> list[PoolingRequestOutput]:
        """vLLM's LLM.encode: each prompt's pooled output as the engine's pooler makes it."""
        batch = text_prompts(prompts)
        if self.engine.pooler is None:
            raise ValueError("LLM.encode needs a pooling model (runner='pooling'); this one generates")
        params = per_prompt(pooling_params or PoolingParams(), len(batch), "pooling params")
        return self._run(batch, params, [None] * len(batch))

    def reward(self, prompts: Prompts,
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None) -> list[PoolingRequestOutput]:
        """vLLM's LLM.reward: a reward model's output per prompt — per token (ALL), or per step (STEP: a process
        reward model's probabilities at each step tag)."""
        self._require_task("reward", "LLM.reward")
        return self.encode(prompts, pooling_params)

    def classify(self, prompts: Prompts) -> list[ClassificationRequestOutput]:
        """vLLM's LLM.classify: each prompt's class probabilities."""
        batch = text_prompts(prompts)
        if isinstance(self.encoder, EncoderClassifier):
            probs, _ = self.encoder.classify(list(batch), self.encoder.classify_activation)
            return [ClassificationRequestOutput(str(next(self._ids)), self.encoder.encoding(p)["input_ids"],
                                                ClassificationOutput(row.tolist())) for p, row in zip(batch, probs)]
        self._require_task("classify", "LLM.classify")
        return [ClassificationRequestOutput(o.request_id, o.prompt_token_ids,
                                            ClassificationOutput(o.outputs.data.tolist())) for o in self.encode(batch)]

    def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str]) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score: text_1 against each text_2 (or pair by pair) — a cross-encoder's relevance, or an
        embedding model's cosine similarity."""
        pairs = pair_texts(_texts(text_1, "text_1"), _texts(text_2, "text_2"))
        ids, scores = self._pair_scores(pairs)
        return [ScoringRequestOutput(str(next(self._ids)), row, ScoringOutput(value)) for row, value in zip(ids, scores)]

    def _pair_scores(self, pairs: list[Pair]) -> tuple[list[list[int]], list[float]]:
        if isinstance(self.encoder, EncoderClassifier):
            _one_label(len(self.encoder.labels))
            probs, _ = self.encoder.classify(list(pairs), self.encoder.score_activation)
            return [self.encoder.encoding(pair)["input_ids"] for pair in pairs], probs[:, 0].tolist()
        texts: list[str | list[int]] = [text for pair in pairs for text in pair]
        if isinstance(self.encoder, EmbeddingModel) or (self.engine.pooler and self.engine.pooler.task == "embed"):
            outputs = self.embed(texts)
            vectors = [torch.tensor(o.outputs.embedding) for o in outputs]
            return [a.prompt_token_ids + b.prompt_token_ids for a, b in zip(outputs[0::2], outputs[1::2])], \
                cosine_scores(vectors)
        self._require_task("classify", "LLM.score")
        _one_label(self.engine.pooler.labels if self.engine.pooler else 0)
        tokenizer = self.engine.tokenizer
        ids = [list(tokenizer(first, second)["input_ids"]) for first, second in pairs]
        return ids, [float(o.outputs.data[0]) for o in self.encode(ids)]  # type: ignore[arg-type]

    def _require_task(self, task: str, call: str) -> None:
        if self.encoder is not None:
            kind = "an embedding model" if isinstance(self.encoder, EmbeddingModel) else "a classifier"
            raise ValueError(f"{call} needs a {task} model; this encoder is {kind}")
        pooler = self.engine.pooler
        if pooler is None or pooler.task != task:
            what = f"runs as a {pooler.task} model" if pooler is not None else "generates"
            raise ValueError(f"{call} needs a model whose pooling task is {task}; this one {what}")


def _texts(value: str | Sequence[str], name: str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    if not items or not all(isinstance(item, str) and item for item in items):
        raise ValueError(f"{name} must be a non-empty text or a non-empty list of them")
    return items


def _one_label(labels: int) -> None:
    if labels != 1:
        raise ValueError(f"LLM.score needs a one-label cross-encoder (or an embedding model); this classifier has "
                         f"{labels} labels: use LLM.classify")
