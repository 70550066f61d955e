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
            for family, labels in (("bert", 1), ("xlm-roberta", 1), ("modernbert", 1), ("bert", 3))}


@pytest.mark.parametrize("family", ["bert", "xlm-roberta", "modernbert"])
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


QWEN3_RERANKER = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
                  "is_original_qwen3_reranker": True}  # vLLM's recipe for Qwen/Qwen3-Reranker-*


def test_qwen3_reranker_scores_are_p_yes(tmp_path, tokenizer):
    """A Qwen3-Reranker-style checkpoint (a plain Qwen3ForCausalLM, tied embeddings) scored from its yes/no
    logits equals the model card's formula computed with transformers: softmax over (no, yes) at the last token."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from helpers.models import save_random_model
    from llmctl import LLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=True)
    folder = save_random_model(config, tmp_path / "qwen3-reranker", tokenizer)
    llm = LLM(str(folder), runner="pooling", hf_overrides=QWEN3_RERANKER, max_model_len=128)
    ours = np.array([o.outputs.score for o in llm.score(QUERY, DOCUMENTS)])
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    no, yes = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    with torch.no_grad():
        expected = [torch.softmax(model(input_ids=torch.tensor([tokenizer(QUERY, d)["input_ids"]])).logits[0, -1, [no, yes]],
                                  -1)[1].item() for d in DOCUMENTS]
    assert np.abs(ours - np.array(expected)).max() < 1e-4 and np.ptp(expected) > 0.01
