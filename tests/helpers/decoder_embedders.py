"""Tiny decoder models saved in sentence-transformers' layout, as Qwen3-Embedding and e5-mistral ship: random
weights, the default model's tokenizer, a Pooling module (last token or mean) and optionally Normalize."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

FAMILIES = {  # family -> (transformers config class, sentence-transformers pooling mode)
    "qwen3": ("Qwen3Config", "lasttoken"),
    "llama": ("LlamaConfig", "mean"),
}


TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16)


def write_decoder_embedder(base: Path, family: str, tokenizer, normalize: bool = True,
                           matryoshka: tuple[int, ...] = (), shape: dict | None = None,
                           dtype: torch.dtype = torch.float32) -> Path:
    """`shape`: the transformers config's sizes (TINY by default); `dtype`: the weights' as saved (bfloat16 as
    Qwen3-Embedding ships)."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    config_class, mode = FAMILIES[family]
    config = getattr(transformers, config_class)(vocab_size=len(tokenizer), max_position_embeddings=512,
                                                 tie_word_embeddings=False, **(shape or TINY))
    torch.manual_seed(0)
    body_folder = base / f"{family}-body"
    model = transformers.AutoModel.from_config(config).to(torch.float32).eval()
    with torch.no_grad():  # large enough that every layer moves the output
        for param in model.parameters():
            param.normal_(0, 0.2 if shape is None else 0.02)
    model.to(dtype).save_pretrained(body_folder, safe_serialization=True)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None  # sentence-transformers 6 renders text through a chat template when there is one
    plain.save_pretrained(body_folder)
    body = Transformer(str(body_folder))
    if body.tokenizer.pad_token is None:
        body.tokenizer.pad_token = body.tokenizer.eos_token
    modules = [body, Pooling(config.hidden_size, pooling_mode=mode)] + ([Normalize()] if normalize else [])
    folder = base / f"{family}-embedder"
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    if matryoshka:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, "matryoshka_dimensions": list(matryoshka)}))
    return folder


def write_decoder_classifier(base: Path, family: str, tokenizer, labels: int) -> Path:
    """A tiny ...ForSequenceClassification (transformers' `score` head on the last token), as Qwen2 and Qwen3
    classifiers and rerankers ship; its pad token set, as transformers needs to find the last token."""
    import transformers

    config_class = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}[family]
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, num_labels=labels,
        id2label={i: f"class_{i}" for i in range(labels)}, label2id={f"class_{i}": i for i in range(labels)},
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(config).to(torch.float32).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.2)
    folder = base / f"{family}-classifier"
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def reference(folder, texts, **kwargs):
    """sentence-transformers' own embeddings of `texts` (its encode keyword arguments passed on)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    if model.tokenizer.pad_token is None:
        model.tokenizer.pad_token = model.tokenizer.eos_token
    return model.encode(texts, **kwargs)


def write_reward_model(base: Path, architecture: str, tokenizer) -> Path:
    """A tiny Qwen2 reward model as Qwen2.5-Math-PRM (`Qwen2ForProcessRewardModel`, two labels) and
    Qwen2.5-Math-RM (`Qwen2ForRewardModel`, one) ship it: transformers' Qwen2Model as `model.*` and their remote
    code's head, Linear → ReLU → Linear, as `score.0`, `score.2`. transformers has no class for either."""
    import transformers
    from safetensors.torch import save_file

    labels = {"Qwen2ForProcessRewardModel": 2, "Qwen2ForRewardModel": 1}[architecture]
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=512,
                                      tie_word_embeddings=False, **{k: v for k, v in TINY.items() if k != "head_dim"})
    torch.manual_seed(1)
    body = transformers.Qwen2Model(config).to(torch.float32).eval()
    head = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, labels))
    with torch.no_grad():
        for param in [*body.parameters(), *head.parameters()]:
            param.normal_(0, 0.2)
    folder = base / architecture
    folder.mkdir()
    tensors = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()}
    tensors.update({f"score.{k}": v.contiguous() for k, v in head.state_dict().items()})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    raw = {**config.to_dict(), "architectures": [architecture]}
    (folder / "config.json").write_text(json.dumps(raw))
    tokenizer.save_pretrained(folder)
    return folder


def reward_reference(folder: Path, token_ids: list[int]) -> torch.Tensor:
    """Each token's score-head output, as the model card computes it: transformers' Qwen2Model, then the head."""
    import transformers
    from safetensors.torch import load_file

    body = transformers.Qwen2Model.from_pretrained(str(folder)).eval()
    tensors = load_file(str(folder / "model.safetensors"))
    labels = tensors["score.2.weight"].shape[0]
    head = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, labels))
    head.load_state_dict({k.removeprefix("score."): v for k, v in tensors.items() if k.startswith("score.")})
    with torch.no_grad():
        return head(body(input_ids=torch.tensor([token_ids])).last_hidden_state[0])
