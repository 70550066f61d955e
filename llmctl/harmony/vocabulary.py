"""The o200k_base vocabulary openai-harmony needs, taken from the model's own tokenizer when it holds it.

openai-harmony downloads o200k_base.tiktoken from OpenAI on first use unless TIKTOKEN_ENCODINGS_BASE names a
folder that holds it (vLLM's offline advice). gpt-oss's tokenizer.json carries the same 199,998 byte-level
tokens, so llmctl writes the file from it, checks it against the published SHA-256, and points
TIKTOKEN_ENCODINGS_BASE at it: a gpt-oss checkpoint serves with no download and no extra file."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmctl.cache import llmctl_cache_dir
from llmctl.errors import LlmctlError

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken's expected_hash
ORDINARY_TOKENS = 199_998  # o200k_base's ranks; ids from here on are special tokens


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character a tokenizer.json writes for each byte, to that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: byte for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + shifted
            shifted += 1
    return {chr(char): byte for byte, char in chars.items()}


def o200k_from_vocab(vocab: dict[str, int]) -> bytes | None:
    """o200k_base.tiktoken's exact bytes from a byte-level vocabulary (token → id), or None when the
    vocabulary is not o200k's."""
    alphabet = byte_level_alphabet()
    by_id: dict[int, str] = {index: token for token, index in vocab.items() if index < ORDINARY_TOKENS}
    if len(by_id) != ORDINARY_TOKENS:
        return None
    lines = []
    for index in range(ORDINARY_TOKENS):
        try:
            raw = bytes(alphabet[char] for char in by_id[index])
        except KeyError:
            return None  # not a byte-level token
        lines.append(f"{base64.b64encode(raw).decode()} {index}\n")
    data = "".join(lines).encode()
    return data if hashlib.sha256(data).hexdigest() == VOCAB_SHA256 else None


def provide_vocabulary(tokenizer: Any) -> Path | None:
    """Point TIKTOKEN_ENCODINGS_BASE at o200k_base.tiktoken written from the tokenizer (once, in llmctl's
    cache), unless the user set it; the folder, or None when the tokenizer does not hold o200k."""
    if os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        return Path(os.environ["TIKTOKEN_ENCODINGS_BASE"])
    folder = llmctl_cache_dir() / "tiktoken"
    if not _verified(folder / VOCAB_FILE):
        data = o200k_from_vocab(tokenizer.get_vocab())
        if data is None:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{VOCAB_FILE}.{os.getpid()}.partial"
        partial.write_bytes(data)
        partial.replace(folder / VOCAB_FILE)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    return folder


def _verified(path: Path) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == VOCAB_SHA256


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    """openai-harmony's gpt-oss encoding; a failure to reach its vocabulary says what to do."""
    from openai_harmony import HarmonyEncodingName, HarmonyError, load_harmony_encoding

    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except HarmonyError as exc:
        raise LlmctlError(f"openai-harmony could not load the o200k_base vocabulary ({exc}): put {VOCAB_FILE} in a "
                          "folder and set TIKTOKEN_ENCODINGS_BASE to it (vLLM's offline advice)") from None
