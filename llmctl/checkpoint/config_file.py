"""A checkpoint's config.json, read once into a ModelSpec."""

from __future__ import annotations

from typing import Any

from llmctl.checkpoint.source import ModelSource, read_json
from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import CorruptModelError


def load_config(source: ModelSource) -> dict[str, Any]:
    path = source.file("config.json")
    if path is None:
        raise CorruptModelError(
            f"{source.name} has no config.json: it is not a transformers model repository "
            "(pass a model folder or a hub id of a model)"
        )
    return read_json(path)


def load_spec(source: ModelSource) -> ModelSpec:
    return ModelSpec.from_config(load_config(source))
