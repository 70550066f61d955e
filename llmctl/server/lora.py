"""The adapters a server offers by name: --lora-modules at startup, and vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter at runtime (with --allow-runtime-lora-updating).

A request picks an adapter with its `model` field. Every load gets a fresh id, so the
engine's prefix cache never mixes K/V of an adapter with that of a reload under the same
name. Loading reads and checks the adapter in every replica before the name is served.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from llmctl.engine.front.engine_client import EngineClient
from llmctl.engine.lora.request import LoRARequest
from llmctl.errors import LlmctlError, ModelNotFoundError
from llmctl.server.protocol import model_permission

logger = logging.getLogger("llmctl.server")


@dataclass(frozen=True)
class LoRAModulePath:
    """One --lora-modules entry, as vLLM's: `name=path` or `{"name": …, "path": …, "base_model_name": …}`."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str]) -> list[LoRAModulePath]:
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            try:
                raw = json.loads(value)
                modules.append(LoRAModulePath(str(raw["name"]), str(raw["path"]), raw.get("base_model_name")))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise LlmctlError(f"--lora-modules {value!r}: JSON entries need \"name\" and \"path\"") from None
            continue
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise LlmctlError(f"--lora-modules {value!r}: use name=path (e.g. sql=./sql-lora) or JSON")
        modules.append(LoRAModulePath(name, path))
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise LlmctlError(f"--lora-modules names each adapter once; repeated: {sorted({n for n in names if names.count(n) > 1})}")
    return modules


class AdapterLoadError(LlmctlError):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ServedAdapters:
    """Adapter names → LoRARequests, loaded into every engine replica."""

    def __init__(self, base_model_names: list[str]) -> None:
        self.base_model_names = base_model_names
        self.by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, name: str) -> LoRARequest | None:
        return self.by_name.get(name)

    def load(self, engine: EngineClient, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """Read and check the adapter in every replica, then serve it under `name`."""
        if name in self.base_model_names:
            raise AdapterLoadError(f"'{name}' is the base model's name: give the adapter another", 400)
        if name in self.by_name:
            raise AdapterLoadError(f"The lora adapter '{name}' has already been loaded.", 400)
        with self._lock:
            request = LoRARequest(name, next(self._ids), path, base_model_name)
        try:
            engine.add_lora(request)  # into every replica
        except ModelNotFoundError as exc:
            engine.remove_lora(request.lora_int_id)
            raise AdapterLoadError(str(exc), 404) from None
        except LlmctlError as exc:
            engine.remove_lora(request.lora_int_id)
            raise AdapterLoadError(str(exc), 400) from None
        self.by_name[name] = request
        return request

    def unload(self, engine: EngineClient, name: str) -> None:
        request = self.by_name.pop(name, None)
        if request is None:
            raise AdapterLoadError(f"The lora adapter '{name}' cannot be found.", 404)
        engine.remove_lora(request.lora_int_id)

    def cards(self, created: int) -> list[dict[str, Any]]:
        """/v1/models entries, as vLLM lists adapters: root is the path, parent the base model."""
        return [{"id": r.lora_name, "object": "model", "created": created, "owned_by": "llmctl", "root": r.lora_path,
                 "parent": r.base_model_name or self.base_model_names[0], "max_model_len": None,
                 "permission": [model_permission(created)]} for r in self.by_name.values()]
