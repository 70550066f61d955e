"""Cross-encoders and classifiers offline (LLM.score, LLM.classify) against sentence-transformers' CrossEncoder
and transformers' AutoModelForSequenceClassification: tiny random BERT and XLM-R rerankers (encoders, through
transformers' modules) and decoder classifiers on the paged engine (Qwen2 with three labels, Qwen3 with one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

QUERY = "abc def"
DOCUMENTS = ["abc", "xyz qq", "def abc ab", "m n o p q r"]


@pytest.fixture(scope="module")
def cross_encoders(tmp_path_factory):
    from helpers.cross_encoders import write_cross_encoder

    base = tmp_path_factory.mktemp("cross-encoders")
    return {(family, labels): write_cross_encoder(base, family, labels)
            for family, labels in (("bert", 1), ("xlm-roberta", 1), ("bert", 3))}


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_score_equals_cross_encoder_predict(cross_encoders, family):
    from sentence_transformers import CrossEncoder

    from helpers.cross_encoders import same_order
    from llmctl import LLM

    folder = cross_encoders[(family, 1)]
    ours = np.array([o.outputs.score for o in LLM(str(folder)).score(QUERY, DOCUMENTS)])
    expected = CrossEncoder(str(folder), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    assert np.abs(ours - expected).max() < 1e-4
    assert same_order(ours, expected) and np.ptp(expected) > 0.01  # scores far enough apart to rank


def test_classify_equals_transformers_probabilities(cross_encoders):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from llmctl import LLM

    folder = cross_encoders[("bert", 3)]
    llm = LLM(str(folder))
    ours = np.array([o.outputs.probs for o in llm.classify(DOCUMENTS)])
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        expected = torch.softmax(model(**tokenizer(DOCUMENTS, padding=True, return_tensors="pt")).logits, -1).numpy()
    assert ours.shape == (4, 3) and np.abs(ours - expected).max() < 1e-4
    with pytest.raises(ValueError, match="one-label cross-encoder"):
        llm.score(QUERY, DOCUMENTS)
    with pytest.raises(ValueError, match="not generation"):
        llm.generate("a")


@pytest.fixture(scope="module")
def decoder_classifiers(tmp_path_factory, tokenizer):
    from helpers.decoder_embedders import write_decoder_classifier

    base = tmp_path_factory.mktemp("decoder-classifiers")
    return {"qwen2": write_decoder_classifier(base, "qwen2", tokenizer, labels=3),
            "qwen3": write_decoder_classifier(base, "qwen3", tokenizer, labels=1)}


def _transformers_logits(folder, inputs):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():  # one at a time: no padding question
        return torch.cat([model(input_ids=torch.tensor([ids])).logits for ids in inputs])


def test_decoder_classifier_on_the_engine(decoder_classifiers, tokenizer):
    from llmctl import LLM

    folder = decoder_classifiers["qwen2"]
    llm = LLM(str(folder), max_model_len=128)
    ours = np.array([o.outputs.probs for o in llm.classify(DOCUMENTS)])
    expected = torch.softmax(_transformers_logits(folder, [tokenizer.encode(d) for d in DOCUMENTS]), -1).numpy()
    assert ours.shape == (4, 3) and np.abs(ours - expected).max() < 1e-4


def test_decoder_cross_encoder_scores_pairs(decoder_classifiers, tokenizer):
    from llmctl import LLM

    folder = decoder_classifiers["qwen3"]
    ours = np.array([o.outputs.score for o in LLM(str(folder), max_model_len=128).score(QUERY, DOCUMENTS)])
    pairs = [tokenizer(QUERY, d)["input_ids"] for d in DOCUMENTS]
    expected = torch.sigmoid(_transformers_logits(folder, pairs))[:, 0].numpy()
    assert np.abs(ours - expected).max() < 1e-4
