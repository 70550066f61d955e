"""Safetensors headers only: dtypes and shapes of every tensor, never the tensor data.

Local files are parsed from their first bytes; remote hub files are read with HTTP range
requests by huggingface_hub (a few hundred KB for a 352 GB checkpoint). Offline, with no
cached shards, only the index (tensor names and total_size) is available.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmctl.checkpoint.source import ModelSource, SourceKind, hub_is_offline, read_json
from llmctl.errors import CorruptModelError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass
class WeightHeaders:
    """What the safetensors headers (or, failing them, the index) say about the weights."""

    origin: str  # "local headers" | "remote headers (HTTP range requests)" | "index only" | "none"
    tensors: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    index_total_size: int | None = None
    index_tensor_names: list[str] = field(default_factory=list)
    shard_count: int = 0
    reason: str | None = None  # why headers are missing, when they are


def read_weight_headers(source: ModelSource) -> WeightHeaders:
    index_path = source.file(INDEX_FILE)
    index = read_json(index_path) if index_path else None
    index_total = None
    names: list[str] = []
    shards: set[str] = set()
    if index is not None:
        index_total = (index.get("metadata") or {}).get("total_size")
        weight_map = index.get("weight_map") or {}
        names = list(weight_map)
        shards = set(weight_map.values())
    local_files = [source.path / s for s in shards] if shards else [source.path / SINGLE_FILE]
    if all(f.is_file() for f in local_files):
        tensors = read_local_headers(local_files)
        return WeightHeaders("local headers", tensors, index_total, names, len(local_files))
    reason = "offline and the shards are not in the cache" if source.kind == SourceKind.HUB else "no safetensors files"
    if source.kind == SourceKind.HUB and source.repo_id and not hub_is_offline():
        remote, reason = _read_remote_headers(source)
        if remote is not None:
            remote.index_total_size, remote.index_tensor_names = index_total, names
            return remote
    origin = "index only" if index is not None else "none"
    return WeightHeaders(origin, {}, index_total, names, len(shards), reason=reason)


def read_local_headers(files: list[Path]) -> dict[str, tuple[str, tuple[int, ...]]]:
    from huggingface_hub import parse_local_safetensors_file_metadata

    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in files:
        try:
            metadata = parse_local_safetensors_file_metadata(path)
        except Exception as exc:
            raise CorruptModelError(
                f"{path.name} in {path.parent} has a corrupt safetensors header ({_short(exc)}): "
                "re-download the file"
            ) from None
        for name, info in metadata.tensors.items():
            tensors[name] = (info.dtype, tuple(info.shape))
    return tensors


def _read_remote_headers(source: ModelSource) -> tuple[WeightHeaders | None, str]:
    """The headers by HTTP range requests, or None and what really went wrong."""
    from huggingface_hub import get_safetensors_metadata

    assert source.repo_id is not None, "remote headers are read for hub models"
    try:
        metadata = get_safetensors_metadata(source.repo_id, revision=source.commit or source.revision)
    except Exception as exc:
        name = type(exc).__name__
        if name == "SafetensorsParsingError":
            raise CorruptModelError(
                f"a safetensors header in {source.repo_id} is corrupt ({_short(exc)})"
            ) from None
        return None, _remote_failure(exc)
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {
        name: (info.dtype, tuple(info.shape))
        for file_meta in metadata.files_metadata.values()
        for name, info in file_meta.tensors.items()
    }
    return WeightHeaders("remote headers (HTTP range requests)", tensors,
                         shard_count=len(metadata.files_metadata)), ""


def _remote_failure(exc: Exception) -> str:
    """Say which of the usual causes it was: no safetensors, no access, or the network."""
    name = type(exc).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if name == "NotASafetensorsRepoError":
        return "the repository has no safetensors files"
    if name == "GatedRepoError" or status in (401, 403):
        return f"access denied reading the headers (HTTP {status}): log in with `hf auth login` or set HF_TOKEN"
    if status is not None:
        return f"the hub answered HTTP {status} reading the headers ({_short(exc)})"
    return f"the hub could not be reached reading the headers ({name}: {_short(exc)})"


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]
