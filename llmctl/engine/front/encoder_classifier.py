"""Encoder classifiers and cross-encoder rerankers (BERT, XLM-R: bge-reranker-v2-m3, ms-marco-MiniLM) through
transformers' own ...ForSequenceClassification modules, as the encoder embedding models run (no KV cache, one
forward per request). A cross-encoder scores a (query, document) pair encoded together, as
sentence-transformers' CrossEncoder does. As vLLM: class probabilities take sigmoid for one label and softmax
over several; scores take the activation sentence-transformers saved (`activation_fn`), else the same."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.front.encoder_loading import load_encoder
from llmctl.errors import LlmctlError

ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax", "Tanh": "tanh"}

Pair = tuple[str, str]


class EncoderClassifier:
    def __init__(self, source: ModelSource, spec: ModelSpec, max_model_len: int | None = None,
                 device: str = "cpu", allow_pickle_weights: bool = False) -> None:
        from transformers import AutoModelForSequenceClassification

        self.source, self.spec = source, spec
        self.tokenizer, self.model = load_encoder(source, AutoModelForSequenceClassification, device,
                                                  allow_pickle_weights)
        self.device = torch.device(device)
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.classify_activation = "sigmoid" if len(self.labels) == 1 else "softmax"
        self.score_activation = saved_activation(source.path) or self.classify_activation
        self.max_model_len = min(max_model_len or spec.max_context, spec.max_context)

    def encoding(self, item: str | Pair | list[int]) -> dict[str, list[int]]:
        """The model's inputs for one text, pair (with its segment ids, where the model takes them) or token ids."""
        if isinstance(item, list):
            return {"input_ids": item}
        first, second = (item, None) if isinstance(item, str) else item
        return dict(self.tokenizer(first, second, truncation=False))

    @torch.inference_mode()
    def classify(self, items: list[str | Pair | list[int]], activation: str) -> tuple[torch.Tensor, int]:
        """[N, labels] logits through `activation` (sigmoid, softmax, tanh or none) and the input tokens."""
        encodings = [self.encoding(item) for item in items]
        lengths = [len(e["input_ids"]) for e in encodings]
        for index, length in enumerate(lengths):
            if length > self.max_model_len:
                raise LlmctlError(f"input {index} has {length} tokens; this model's maximum is {self.max_model_len}")
        if len({tuple(e) for e in encodings}) > 1:  # token ids beside texts: the texts' segment ids are dropped
            encodings = [{"input_ids": e["input_ids"]} for e in encodings]
        batch = self.tokenizer.pad(encodings, return_tensors="pt")
        logits = self.model(**{k: v.to(self.device) for k, v in batch.items()}).logits.float().cpu()
        return apply_activation(logits, activation), sum(lengths)


def saved_activation(folder: Path) -> str | None:
    """The score activation sentence-transformers saved: config_sentence_transformers.json (version 5 on) or
    config.json's `sentence_transformers` (before); None when neither names one."""
    for name, read in (("config_sentence_transformers.json", lambda c: c.get("activation_fn")),
                       ("config.json", lambda c: (c.get("sentence_transformers") or {}).get("activation_fn"))):
        try:
            named = read(json.loads((folder / name).read_text()))
        except (OSError, ValueError, AttributeError):
            continue
        if named:
            return ACTIVATIONS.get(str(named).rsplit(".", 1)[-1])
    return None


def apply_activation(logits: torch.Tensor, name: str) -> torch.Tensor:
    if name == "sigmoid":
        return torch.sigmoid(logits)
    if name == "softmax":
        return torch.softmax(logits, dim=-1)
    return torch.tanh(logits) if name == "tanh" else logits
