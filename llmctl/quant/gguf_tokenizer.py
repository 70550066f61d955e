"""A Hugging Face BPE tokenizer written into a GGUF file as llama.cpp's converter writes it
(convert_hf_to_gguf.py's get_vocab_base and gguf-py's SpecialVocab): the tokens in id order with their
types, the merges, the special token ids and the chat template, and `tokenizer.ggml.pre`, the name
llama.cpp gives the tokenizer's pre-splitting rules, found by the same hash its converter computes.

Byte-level BPE only (Llama 3, Qwen, SmolLM, Mistral Nemo, GPT-2 …); SentencePiece vocabularies and
tokenizers whose pre-splitting llama.cpp does not know are refused by name, as its converter refuses them.
"""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path
from typing import Any

from llmctl.errors import LlmctlError
from llmctl.quant.gguf_pre_tokenizers import CHECK_TEXT, PRE_TOKENIZERS

NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # gguf.TokenType


def write_tokenizer(writer: Any, folder: Path, vocab_size: int) -> None:
    """tokenizer.ggml.* keys of the tokenizer in `folder` (tokenizer.json), padded to the model's vocab_size."""
    from gguf.vocab import SpecialVocab
    from transformers import AutoTokenizer

    _check_byte_level_bpe(folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokens, types = token_list(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_name(tokenizer))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    SpecialVocab(str(folder), load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)


def _check_byte_level_bpe(folder: Path) -> None:
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise LlmctlError(f"--format gguf needs the model's tokenizer.json (a fast tokenizer): {folder} has none")
    data = json.loads(path.read_text(encoding="utf-8"))
    model, pre = data.get("model") or {}, json.dumps(data.get("pre_tokenizer"))
    if model.get("type") != "BPE" or "ByteLevel" not in pre:
        raise LlmctlError(f"--format gguf writes byte-level BPE tokenizers (Llama 3, Qwen, SmolLM); this one is "
                          f"{model.get('type', 'unknown')} without byte-level splitting: convert it with llama.cpp's "
                          "convert_hf_to_gguf.py")


def token_list(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[int]]:
    """Tokens in id order and their GGUF types: added special tokens CONTROL, other added tokens
    USER_DEFINED, ids the vocabulary does not use `[PAD{id}]` UNUSED (the embedding has rows for them)."""
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for token_id in range(max(vocab_size, len(by_id))):
        token = by_id.get(token_id)
        if token is None:
            tokens.append(f"[PAD{token_id}]")
            types.append(UNUSED)
        elif token_id in added:
            tokens.append(token)
            types.append(CONTROL if added[token_id].special or _looks_special(token) else USER_DEFINED)
        else:
            tokens.append(token)
            types.append(NORMAL)
    return tokens, types


def _looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's does_token_look_special."""
    return token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>")) \
        or (token.startswith("<｜") and token.endswith("｜>")) or (token.startswith("<unused") and token.endswith(">"))


def pre_tokenizer_name(tokenizer: Any) -> str:
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if digest not in PRE_TOKENIZERS:
        raise LlmctlError("llama.cpp does not know this tokenizer's pre-splitting rules (its converter would "
                          f"refuse it too; check hash {digest[:16]}…): a GGUF written now would tokenize "
                          "differently in llama.cpp. Convert with a llama.cpp new enough to know it")
    return PRE_TOKENIZERS[digest]
