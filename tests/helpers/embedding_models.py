"""A tiny BERT sentence-transformers embedding model (mean pooling, Normalize) whose config names its Matryoshka
sizes: random weights, a 31-entry WordPiece vocabulary."""

from __future__ import annotations

import json
from pathlib import Path


def write_matryoshka_model(base: Path) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoModel, BertConfig, BertTokenizerFast

    words = list("abcdefghijklmnopqrstuvwxyz")
    (base / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]))
    BertTokenizerFast(vocab_file=str(base / "vocab.txt")).save_pretrained(base / "bert")
    torch.manual_seed(0)
    AutoModel.from_config(BertConfig(vocab_size=5 + len(words), hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=2,
                                     max_position_embeddings=64)).save_pretrained(base / "bert")
    body = Transformer(str(base / "bert"))
    SentenceTransformer(modules=[body, Pooling(32, pooling_mode="mean"), Normalize()], device="cpu").save(
        str(base / "st"))
    config = json.loads((base / "st" / "config.json").read_text())
    (base / "st" / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16, 32]}))
    return base / "st"
