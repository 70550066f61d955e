"""An encoder checkpoint loaded through transformers (its tokenizer and one Auto class), float32, safetensors
only unless pickled weights are allowed: the one loading path of embedding models and encoder classifiers."""

from __future__ import annotations

from typing import Any

import torch

from llmctl.checkpoint.source import ModelSource


def load_encoder(source: ModelSource, auto_class: Any, device: str, allow_pickle_weights: bool) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode on `device`)."""
    from transformers import AutoTokenizer

    from llmctl.checkpoint.weights import safetensors_files

    if not allow_pickle_weights:
        safetensors_files(source.path)  # a clear error when only pickled .bin weights are there
    tokenizer = AutoTokenizer.from_pretrained(str(source.path), trust_remote_code=False)
    model = auto_class.from_pretrained(str(source.path), dtype=torch.float32, trust_remote_code=False,
                                       use_safetensors=None if allow_pickle_weights else True)
    return tokenizer, model.to(device).eval()
