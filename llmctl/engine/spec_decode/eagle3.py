"""EAGLE-3 speculative decoding (--speculative-config '{"method": "eagle3", "model": HEAD, ...}'): the published
head (llmctl.engine.spec_decode.eagle3_head) reading the residual stream that enters three of the target's layers,
run by the hidden-state proposer (llmctl.engine.spec_decode.hidden_proposer)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from llmctl.checkpoint.source import resolve_model
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.spec_decode.config import SpeculativeConfig
from llmctl.engine.spec_decode.eagle3_head import Eagle3Head, Eagle3Shape
from llmctl.engine.spec_decode.hidden_proposer import HiddenStateProposer
from llmctl.engine.worker.loaded_model import LoadedModel

logger = logging.getLogger("llmctl.engine")


def eagle3_proposer(spec_config: SpeculativeConfig, config: EngineConfig, target: LoadedModel,
                    generator: torch.Generator) -> HiddenStateProposer:
    model: Any = target.model  # a Llama-family model: aux_layers and aux_hidden (llmctl.engine.models.llama)
    if not hasattr(model, "aux_layers") or target.kv_groups.hybrid:
        raise SpeculativeConfigError(f"EAGLE-3 reads the target's hidden states between layers: llmctl does that "
                                     f"for Llama-family models so far, not {target.spec.model_type}")
    head = _load_head(spec_config.model or "", config, target)
    setattr(model, "aux_layers", head.shape.aux_layers)  # noqa: B010 — the target reads it each step
    shape = head.shape
    cache = KVCache(torch.zeros((target.kv_pool.num_blocks, config.block_size, 2, shape.kv_heads, shape.head_dim),
                                dtype=target.dtype, device=target.device))
    return HiddenStateProposer(head, cache, target, lambda: model.aux_hidden, config.block_size, generator)


def _load_head(name: str, config: EngineConfig, target: LoadedModel) -> Eagle3Head:
    from transformers import AutoConfig

    source = resolve_model(name, weights=True, show_progress=False)
    hf_config = AutoConfig.from_pretrained(str(source.path))
    shape = Eagle3Shape.of(hf_config, target.spec.num_layers)
    if any(not 0 <= layer < target.spec.num_layers for layer in shape.aux_layers):
        raise SpeculativeConfigError(f"the EAGLE-3 head {name} reads layers {list(shape.aux_layers)}; the target has "
                                     f"{target.spec.num_layers}")
    head = Eagle3Head(shape, hf_config, target.spec.hidden_size, target.spec.vocab_size)
    head.load(source.path, target.dtype, config.allow_pickle_weights)
    head.to(device=target.device, dtype=target.dtype)
    head.target_embed = target.model.embed
    logger.info("EAGLE-3 head %s: reads target layers %s, a %d-token vocabulary", name, list(shape.aux_layers),
                shape.draft_vocab)
    return head
