"""Tiny cross-encoders saved as sentence-transformers CrossEncoders (random weights, a 31-entry WordPiece
vocabulary): a BERT reranker (one label, segment ids), an XLM-R one (bge-reranker-v2-m3's architecture) and a
ModernBERT one (no segment ids), and a three-label BERT classifier."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = list("abcdefghijklmnopqrstuvwxyz")


def write_cross_encoder(base: Path, family: str, labels: int = 1) -> Path:
    from sentence_transformers import CrossEncoder
    from transformers import (
        AutoModelForSequenceClassification,
        BertConfig,
        BertTokenizerFast,
        ModernBertConfig,
        XLMRobertaConfig,
    )

    (base / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]))
    tokenizer = BertTokenizerFast(vocab_file=str(base / "vocab.txt"))
    shape = dict(vocab_size=5 + len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_labels=labels, id2label={i: f"class_{i}" for i in range(labels)},
                 label2id={f"class_{i}": i for i in range(labels)})
    if family == "xlm-roberta":
        config = XLMRobertaConfig(**shape, max_position_embeddings=66, pad_token_id=0, type_vocab_size=1)
    elif family == "modernbert":
        config = ModernBertConfig(**shape, max_position_embeddings=64, pad_token_id=0, cls_token_id=2,
                                  sep_token_id=3, bos_token_id=2, eos_token_id=3)
    else:
        config = BertConfig(**shape, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    with torch.no_grad():  # spread enough that documents score apart (LayerNorms as initialized)
        for name, param in model.named_parameters():
            if "LayerNorm" not in name:
                param.normal_(0, 0.2)
    raw = base / f"{family}-{labels}-raw"
    model.save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    if family in ("xlm-roberta", "modernbert"):  # their tokenizers give no segment ids
        settings = json.loads((raw / "tokenizer_config.json").read_text())
        settings["model_input_names"] = ["input_ids", "attention_mask"]
        (raw / "tokenizer_config.json").write_text(json.dumps(settings))
    folder = base / f"{family}-{labels}-cross-encoder"
    CrossEncoder(str(raw), device="cpu").save(str(folder))
    return folder


def same_order(ours, expected, margin: float = 2e-4) -> bool:
    """Every pair of documents the reference scores more than `margin` apart is ranked the same way."""
    return all(ours[i] > ours[j] for i in range(len(expected)) for j in range(len(expected))
               if expected[i] - expected[j] > margin)
