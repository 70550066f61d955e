"""What `--models` names: NAME=PATH (and that model's own `llmctl serve` flags after the path), or a folder whose
subfolders and GGUF files are the models."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import LlmctlError
from llmctl.server.lora import parse_lora_modules


@dataclass(frozen=True)
class RoutedModel:
    name: str  # what requests put in `model`
    path: str  # a folder, GGUF file or hub id; "" for the default model
    flags: tuple[str, ...] = ()  # its own serve flags, after the shared ones (the later value wins)
    adapters: tuple[str, ...] = ()  # the LoRA adapters its --lora-modules serve, routed to it too


def parse_models(values: list[str]) -> list[RoutedModel]:
    models = [model for value in values for model in _parse_one(value)]
    names = [name for model in models for name in (model.name, *model.adapters)]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise LlmctlError(f"--models names each model and adapter once; repeated: {', '.join(repeated)}")
    if not models:
        raise LlmctlError("--models found no model: give NAME=PATH, or a folder holding model folders or .gguf files")
    return models


def _parse_one(value: str) -> list[RoutedModel]:
    words = shlex.split(value)
    if not words:
        raise LlmctlError("--models takes NAME=PATH or a folder of models, not an empty value")
    name, sep, path = words[0].partition("=")
    if not sep:
        if len(words) > 1:
            raise LlmctlError(f"--models {value!r}: flags follow NAME=PATH only (a folder's models share the "
                              "command line's flags)")
        return _folder_models(Path(name))
    if not name:
        raise LlmctlError(f"--models {value!r}: use NAME=PATH, e.g. chat=./Qwen3-0.6B, or NAME= for the default model")
    flags = tuple(words[1:])
    if "--served-model-name" in flags or "--port" in flags or "--host" in flags:
        raise LlmctlError(f"--models {value!r}: the name, host and port of each model's server are the router's")
    return [RoutedModel(name, path, flags, _adapter_names(flags))]


def _adapter_names(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The names its --lora-modules give (vLLM's NAME=PATH or JSON entries, up to the next flag)."""
    values: list[str] = []
    taking = False
    for word in flags:
        if word.startswith("--"):
            taking = word == "--lora-modules"
        elif taking:
            values.append(word)
    return tuple(module.name for module in parse_lora_modules(values))


def _folder_models(folder: Path) -> list[RoutedModel]:
    if not folder.is_dir():
        raise LlmctlError(f"--models {str(folder)!r} is neither NAME=PATH nor a folder")
    found = [RoutedModel(child.name, str(child)) for child in sorted(folder.iterdir())
             if child.is_dir() and ((child / "config.json").is_file() or any(child.glob("*.gguf")))]
    found += [RoutedModel(child.stem, str(child)) for child in sorted(folder.glob("*.gguf"))]
    return found
