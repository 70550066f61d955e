"""What vLLM's loading flags ask of a model load: --load-format (which weight files, or random
weights), -q/--quantization (checked against the checkpoint's method: llmctl quantizes nothing at
load), --tokenizer (another tokenizer and chat template) and --generation-config (the sampling
defaults' source); and what models with recurrent layers cannot be run with yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.source import ModelSource, SourceKind, resolve_model
from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.tokenizer import generation_defaults, generation_file_defaults
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.settings import QUANTIZATION_ALIASES

DUMMY_RANGE = 1e-3  # vLLM's dummy weights: uniform in [-1e-3, 1e-3]


def check_load_flags(config: EngineConfig, source: ModelSource, spec: ModelSpec) -> None:
    """The checkpoint is what --load-format and --quantization say it is; else one line saying what to pass."""
    method = "gguf" if source.gguf_path is not None else (spec.quantization.method if spec.quantization else None)
    if config.load_format == "gguf" and source.gguf_path is None:
        raise EngineConfigError(f"--load-format gguf: {source.name} is not a GGUF file; pass the .gguf path, or "
                                "leave --load-format auto")
    if config.load_format == "safetensors" and source.gguf_path is not None:
        raise EngineConfigError(f"--load-format safetensors: {source.name} is a GGUF file; leave --load-format auto")
    if config.load_format == "dummy" and method is not None:
        raise EngineConfigError(f"--load-format dummy makes random weights for unquantized checkpoints; {source.name} "
                                f"is {method}-quantized")
    if config.quantization is None:
        return
    asked = QUANTIZATION_ALIASES.get(config.quantization, config.quantization)
    if method is None:
        raise EngineConfigError(f"--quantization {config.quantization}: {source.name} is not quantized and llmctl "
                                "quantizes no model while loading; write a quantized checkpoint with `llmctl quantize` "
                                "(GPTQ, AWQ) and serve that, or leave --quantization out")
    if asked != method:
        raise EngineConfigError(f"--quantization {config.quantization} does not match {source.name}'s quantization "
                                f"({method}): leave --quantization out, or pass {method}")


def tokenizer_source(config: EngineConfig, source: ModelSource) -> ModelSource:
    """--tokenizer's files (a hub id or folder; only its tokenizer and config files are fetched), else the model's."""
    if config.tokenizer is None:
        return source
    folder = Path(config.tokenizer).expanduser()
    if folder.is_dir():  # a tokenizer folder needs no config.json (vLLM takes one as it is)
        return ModelSource(SourceKind.LOCAL, config.tokenizer, folder)
    return resolve_model(config.tokenizer, config.revision if config.tokenizer == config.model else None,
                         show_progress=config.show_progress)


def sampling_defaults(config: EngineConfig, source: ModelSource) -> dict[str, Any]:
    """--generation-config: auto (the model's generation_config.json), vllm (none: vLLM's and llmctl's own
    defaults), or a folder holding a generation_config.json."""
    if config.generation_config == "auto":
        return generation_defaults(source)
    if config.generation_config == "vllm":
        return {}
    path = Path(config.generation_config) / "generation_config.json"
    if not path.is_file():
        raise EngineConfigError(f"--generation-config {config.generation_config}: no generation_config.json there; "
                                "pass auto, vllm or a folder that has one")
    return generation_file_defaults(path)


def fill_dummy(model: nn.Module) -> None:
    """--load-format dummy: every weight uniform in ±1e-3 (as vLLM's dummy loader), then the modules' own
    finishing step, as after a real load."""
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.uniform_(-DUMMY_RANGE, DUMMY_RANGE)
    for module in model.modules():
        finish = getattr(module, "finish_loading", None)
        if callable(finish):
            finish()


def check_recurrent_flags(config: EngineConfig, spec: ModelSpec) -> None:
    """What a model with recurrent layers (Mamba2, gated DeltaNet) is not run with yet: one line naming the flag."""
    if spec.recurrent is None:
        return
    if spec.mixer is None:  # the registry refuses such models first; a guard for the ones to come
        raise EngineConfigError(f"{spec.recurrent.describe()}: llmctl keeps no state for those layers yet")
    refused = {"--speculative-config": config.speculative_config is not None,
               "--async-scheduling": config.async_scheduling, "--enable-lora": config.enable_lora}
    for flag, asked in refused.items():
        if asked:
            raise EngineConfigError(f"{flag}: the {spec.mixer.label} layers of this model run without it in llmctl yet (each "
                                    "sequence's state is whole on one rank, advanced one scheduled step at a time); "
                                    f"leave {flag} out")
