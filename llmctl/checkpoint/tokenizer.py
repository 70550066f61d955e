"""Tokenizer facts, tokenization of sample text, and chat template resolution."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from llmctl.checkpoint.source import ModelSource, read_json
from llmctl.errors import LlmctlError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "qwen.tiktoken", "tiktoken.model")
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")
# llmctl's own templates for architectures whose checkpoints ship none.
BUILTIN_TEMPLATE_FOR_MODEL_TYPE = {"bloom": "bloom"}
logger = logging.getLogger("llmctl")


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # where it came from, e.g. "tokenizer_config.json" or "llmctl templates/bloom.jinja"
    text: str | None
    names: tuple[str, ...] = ()  # named variants ("default", "tool_use", ...)


@dataclass
class TokenizerFacts:
    tokenizer_class: str | None
    loaded: bool  # True when the tokenizer itself was loaded (not only its config)
    vocab_size: int | None
    vocab_source: str
    special_tokens: dict[str, str | None] = field(default_factory=dict)
    special_token_ids: dict[str, int | None] = field(default_factory=dict)
    model_max_length: int | None = None
    chat_template: ChatTemplate = ChatTemplate("none", None)
    note: str | None = None


def tokenizer_facts(source: ModelSource, model_type: str, config_vocab: int, *, trust_remote_code: bool = False) -> TokenizerFacts:
    tokenizer, note = try_load_tokenizer(source, trust_remote_code=trust_remote_code)
    return describe_tokenizer(source, model_type, config_vocab, tokenizer, note)


class TokenizerFile:
    """A checkpoint's tokenizer.json read with the `tokenizers` library (the backend of transformers' fast
    tokenizers) for the facts `inspect` prints: transformers itself imports torch, which a light command must
    not. Special tokens come from the tokenizer's config files, as transformers reads them."""

    class_name = "TokenizersBackend"  # what transformers' AutoTokenizer builds from a bare tokenizer.json

    def __init__(self, path: Path, special_tokens: dict[str, str | None]) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        for key, text in special_tokens.items():
            setattr(self, key, text)
            setattr(self, f"{key}_id", self._tokenizer.token_to_id(text) if text else None)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


def try_load_tokenizer(source: ModelSource, *, trust_remote_code: bool = False,
                       light: bool = False) -> tuple[Any | None, str | None]:
    """The tokenizer when it can be loaded, else None and the reason why not; `light`: a TokenizerFile where
    the checkpoint has a tokenizer.json (no transformers, no torch)."""
    if not any(source.file(name) for name in TOKENIZER_FILES):
        return None, "no tokenizer files in the checkpoint: facts from tokenizer_config.json"
    tok_config = _tokenizer_config(source)
    if _needs_remote_code(tok_config) and not trust_remote_code:
        return None, "the tokenizer is remote code: not loaded (pass --trust-remote-code to run it)"
    if light and (path := source.file("tokenizer.json")) and not _needs_remote_code(tok_config):
        try:
            return TokenizerFile(path, _special_tokens(source, tok_config)), None
        except Exception as exc:  # noqa: BLE001 (a file tokenizers cannot read: transformers may)
            logger.debug("tokenizer.json not read by tokenizers (%s): loading it with transformers", exc)
    try:
        return load_tokenizer(source, trust_remote_code=trust_remote_code), None
    except LlmctlError as exc:
        return None, str(exc)


def describe_tokenizer(source: ModelSource, model_type: str, config_vocab: int, tokenizer: Any | None,
                       note: str | None) -> TokenizerFacts:
    """Facts from the loaded tokenizer, or from its config files when it is not loaded."""
    tok_config = _tokenizer_config(source)
    facts = TokenizerFacts(
        tokenizer_class=tok_config.get("tokenizer_class"),
        loaded=False,
        vocab_size=config_vocab or None,
        vocab_source="config.json vocab_size",
        special_tokens=_special_tokens(source, tok_config),
        model_max_length=_max_length(tok_config.get("model_max_length")),
        chat_template=resolve_chat_template(source, model_type),
        note=note,
    )
    if tokenizer is None:
        return facts
    facts.loaded = True
    facts.vocab_size = len(tokenizer)
    facts.vocab_source = "tokenizer (including added tokens)"
    facts.tokenizer_class = facts.tokenizer_class or getattr(tokenizer, "class_name", type(tokenizer).__name__)
    for key in SPECIAL_TOKENS:
        text = getattr(tokenizer, key, None)
        facts.special_tokens[key] = str(text) if text is not None else None
        facts.special_token_ids[key] = getattr(tokenizer, f"{key}_id", None)
    return facts


def load_tokenizer(source: ModelSource, *, trust_remote_code: bool = False) -> Any:
    """Load the model's tokenizer with transformers; errors become one-line LlmctlErrors."""
    import logging

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return AutoTokenizer.from_pretrained(str(source.path), trust_remote_code=trust_remote_code)
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise LlmctlError(f"could not load the tokenizer of {source.name}: {first_line}") from None


def tokenize_text(tokenizer: Any, text: str) -> list[tuple[int, str]]:
    """Token ids of ``text`` (with the model's special tokens) and each one's decoded piece."""
    ids = tokenizer(text)["input_ids"]
    return [(int(i), tokenizer.decode([i])) for i in ids]


def resolve_chat_template(source: ModelSource, model_type: str) -> ChatTemplate:
    """The model's own template (tokenizer_config, chat_template.jinja/.json), else llmctl's."""
    tok_config = _tokenizer_config(source)
    inline = tok_config.get("chat_template")
    if isinstance(inline, str) and inline:
        return ChatTemplate("tokenizer_config.json", inline)
    if isinstance(inline, list) and inline:  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in inline if isinstance(t, dict)}
        default = named.get("default") or next(iter(named.values()))
        return ChatTemplate("tokenizer_config.json", default, tuple(str(n) for n in named))
    jinja = source.file("chat_template.jinja")
    if jinja:
        return ChatTemplate("chat_template.jinja", jinja.read_text(encoding="utf-8"))
    as_json = source.file("chat_template.json")
    if as_json:
        template = read_json(as_json).get("chat_template")
        if isinstance(template, str):
            return ChatTemplate("chat_template.json", template)
    builtin = BUILTIN_TEMPLATE_FOR_MODEL_TYPE.get(model_type)
    if builtin:
        return ChatTemplate(f"llmctl templates/{builtin}.jinja", builtin_template(builtin))
    return ChatTemplate("none", None)


def builtin_template(name: str) -> str:
    """A chat template shipped in llmctl's templates/ (e.g. 'bloom', 'chatml')."""
    path = resources.files("llmctl.templates") / f"{name}.jinja"
    if not path.is_file():
        available = sorted(p.name.removesuffix(".jinja") for p in resources.files("llmctl.templates").iterdir()
                           if p.name.endswith(".jinja"))
        raise LlmctlError(f"no built-in chat template '{name}': choose one of {', '.join(available)}")
    return path.read_text(encoding="utf-8")


def generation_defaults(source: ModelSource) -> dict[str, Any]:
    """generation_config.json without bookkeeping keys."""
    path = source.file("generation_config.json")
    return generation_file_defaults(path) if path is not None else {}


def generation_file_defaults(path: Path) -> dict[str, Any]:
    """One generation_config.json's settings, without bookkeeping keys."""
    data = read_json(path)
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "transformers_version"}


def _tokenizer_config(source: ModelSource) -> dict[str, Any]:
    path = source.file("tokenizer_config.json")
    return read_json(path) if path else {}


def _needs_remote_code(tok_config: dict[str, Any]) -> bool:
    return "AutoTokenizer" in (tok_config.get("auto_map") or {})


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return str(value) if value is not None else None


def _max_length(value: Any) -> int | None:
    # transformers writes 1e30 for "no limit"
    if isinstance(value, int) and value < 10**12:
        return value
    return None


def _special_tokens(source: ModelSource, tok_config: dict[str, Any]) -> dict[str, str | None]:
    """From tokenizer_config.json, falling back to special_tokens_map.json."""
    path = source.file("special_tokens_map.json")
    token_map = read_json(path) if path else {}
    return {key: _token_text(tok_config.get(key)) or _token_text(token_map.get(key)) for key in SPECIAL_TOKENS}
