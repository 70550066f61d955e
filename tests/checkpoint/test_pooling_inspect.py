"""`llmctl inspect` on embedding, cross-encoder and generative checkpoints: the task and the pooling as
sentence-transformers itself builds the model from the same folder (its Pooling and Normalize modules)."""

from __future__ import annotations

import json

import pytest

ST_NAMES = {"lasttoken": "LAST", "mean": "MEAN", "cls": "CLS", "max": "MAX"}  # sentence-transformers -> vLLM's


def tiny(config_class, tokenizer, folder, **extra):
    import torch
    from transformers import AutoModel

    config = config_class(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **extra)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentence_transformer(folder, mode: str, normalize: bool):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    body = Transformer(str(folder))
    modules = [body, Pooling(body.get_embedding_dimension(), pooling_mode=mode)] + ([Normalize()] if normalize else [])
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(str(folder / "st"))
    return folder / "st"


def report_of(folder):
    from llmctl.checkpoint.source import resolve_model
    from llmctl.inspect_report import build_inspect_report

    return build_inspect_report(resolve_model(str(folder), show_progress=False))


@pytest.mark.parametrize("family, mode, normalize", [("qwen3", "lasttoken", True), ("llama", "mean", False)])
def test_a_decoder_embedding_model_reports_its_sentence_transformers_pooling(tmp_path, tokenizer, family, mode,
                                                                              normalize):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize
    from transformers import LlamaConfig, Qwen3Config

    config_class = {"qwen3": Qwen3Config, "llama": LlamaConfig}[family]
    folder = sentence_transformer(tiny(config_class, tokenizer, tmp_path / family), mode, normalize)
    reference = SentenceTransformer(str(folder), device="cpu")  # what sentence-transformers reads back
    report = report_of(folder)
    pooling = report.pooling
    assert pooling is not None and pooling.task == "embed" and pooling.origin == "modules.json"
    assert report.implementation == "llmctl"  # Qwen3Model / LlamaModel on the native layers of their family
    assert pooling.pooling == ST_NAMES[reference[1].pooling_mode]
    assert pooling.normalize == any(isinstance(module, Normalize) for module in reference)
    assert "embedding model" in pooling.describe()


def test_matryoshka_dimensions_come_from_the_config(tmp_path, tokenizer):
    from transformers import Qwen3Config

    folder = sentence_transformer(tiny(Qwen3Config, tokenizer, tmp_path / "m"), "lasttoken", True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32, 64]}))
    pooling = report_of(folder).pooling
    assert pooling is not None and pooling.matryoshka and pooling.dimensions == (16, 32, 64)
    assert "Matryoshka: 16, 32, 64" in pooling.describe()


def test_a_cross_encoder_is_a_one_label_classifier(tmp_path, tokenizer):
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertTokenizerFast

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]))
    bert_tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    base = tmp_path / "bert"
    BertConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               max_position_embeddings=64).save_pretrained(base)
    bert_tokenizer.save_pretrained(base)
    from transformers import AutoConfig, AutoModel

    AutoModel.from_config(AutoConfig.from_pretrained(base)).save_pretrained(base)
    reference = CrossEncoder(str(base), num_labels=1, device="cpu")
    reference.save(str(tmp_path / "reranker"))
    report = report_of(tmp_path / "reranker")
    pooling = report.pooling
    assert pooling is not None and pooling.task == "classify"
    assert report.implementation == "encoder" and "no paged KV cache" in report.backend.reason
    assert pooling.labels == reference.num_labels == 1
    assert pooling.pooling == "CLS"  # BERT's classification head reads its first token


def test_a_generator_has_no_pooling(default_source):
    from llmctl.inspect_report import build_inspect_report

    assert build_inspect_report(default_source).pooling is None
