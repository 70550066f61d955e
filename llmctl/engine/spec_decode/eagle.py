"""EAGLE-1/2 speculative decoding (--speculative-config '{"method": "eagle", "model": HEAD, ...}'): a head in
EAGLE's published layout (yuhuili/EAGLE-LLaMA3-Instruct-8B and its kind: `fc` [H, 2H] with its bias, one Llama
decoder layer `layers.0.*` without an input norm, the target's embedding and LM head), run as vLLM runs it: the
token's embedding and the target's final (normed) hidden state, side by side, through `fc`, then the layer; its
output is both the next chained step's hidden state and what the target's LM head turns into logits. HASS heads
(`add_para_norm`) norm the embedding and the hidden state first. EAGLE-2's dynamic draft tree is a way of drafting
from the same head; here the head drafts a chain, verified by the rejection sampler, so outputs stay exact."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.source import resolve_model
from llmctl.checkpoint.weights import iterate_tensors
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.models.common import StepContext, Target, layer_index, load_checkpoint
from llmctl.engine.spec_decode.config import SpeculativeConfig
from llmctl.engine.spec_decode.hidden_proposer import HEAD_LAYER, HiddenStateProposer
from llmctl.engine.worker.loaded_model import LoadedModel

logger = logging.getLogger("llmctl.engine")
SAME_AS_TARGET = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
OWN = {"fc.weight", "fc.bias", "embedding_layernorm.weight", "hidden_states_layernorm.weight"}
SPECULATORS_NAMES = {"fusion_fc.weight": "fc.weight", "fusion_fc.bias": "fc.bias",
                     "pre_lm_head_layernorm.weight": "hidden_states_layernorm.weight"}  # as vLLM maps them


class EagleHead(nn.Module):
    def __init__(self, target: Any, head_config: Any, block_index: int, fc_bias: bool) -> None:
        super().__init__()
        h, eps = target.spec.hidden_size, float(getattr(head_config, "rms_norm_eps", 1e-6))
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        self.para_norm = bool(getattr(head_config, "add_para_norm", False))  # HASS
        if self.para_norm:
            self.embedding_layernorm, self.hidden_states_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.block = target.make_layer(block_index, head_config, target.make_rotary(head_config,
                                                                                     target.spec.attention.head_dim), eps)
        self.block.input_layernorm = nn.Identity()  # EAGLE's first layer reads fc's output unnormed
        self.target_embed, self.target_logits = target.embed, target.compute_logits  # bound methods, not submodules
        self.prenorm: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        assert hidden is not None, "a draft step reads the target's hidden states or the step before's"
        embeds = self.target_embed(input_ids)
        if self.para_norm:
            embeds, hidden = self.embedding_layernorm(embeds), self.hidden_states_layernorm(hidden)
        self.prenorm = self.block(self.fc(torch.cat([embeds, hidden], dim=-1)), ctx, HEAD_LAYER)
        return self.prenorm

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target_logits(hidden).float()


def eagle_proposer(spec_config: SpeculativeConfig, config: EngineConfig, target: LoadedModel,
                   generator: torch.Generator) -> HiddenStateProposer:
    model: Any = target.model
    spec = target.spec
    if not hasattr(model, "keep_last_hidden") or target.kv_groups.hybrid or spec.attention.kind == "MLA" or spec.moe:
        raise SpeculativeConfigError(f"EAGLE heads read the target's final hidden states: llmctl does that for "
                                     f"dense Llama-family models so far, not {spec.model_type}")
    head = _load_head(spec_config.model or "", config, target)
    setattr(model, "keep_last_hidden", True)  # noqa: B010 — the target keeps its final hidden states each step
    cache = KVCache(torch.zeros_like(next(iter(target.kv_caches.values())).kv))  # one more layer of the target's kind
    return HiddenStateProposer(head, cache, target, lambda: model.last_hidden, config.block_size, generator)


def _load_head(name: str, config: EngineConfig, target: LoadedModel) -> EagleHead:
    from transformers import AutoConfig

    source = resolve_model(name, weights=True, show_progress=False)
    head_config = AutoConfig.from_pretrained(str(source.path))
    _check_shape(name, head_config, target.hf_config)
    tensors = list(iterate_tensors(source.path, target.dtype, config.allow_pickle_weights))
    model: Any = target.model
    head = EagleHead(model, head_config, model.stage_layers[-1], fc_bias=any(_our_name(t.name) == "fc.bias"
                                                                             for t in tensors))
    load_checkpoint(head, tensors, _targets(model, model.stage_layers[-1]))
    head.to(device=target.device, dtype=target.dtype)
    logger.info("EAGLE head %s: one decoder layer over the target's final hidden states%s", name,
                " (HASS norms)" if head.para_norm else "")
    return head


def _check_shape(name: str, head_config: Any, target_config: Any) -> None:
    if int(getattr(head_config, "num_hidden_layers", 1)) != 1:
        raise SpeculativeConfigError(f"the EAGLE head {name} has {head_config.num_hidden_layers} decoder layers; "
                                     "llmctl runs the published one-layer heads")
    for key in SAME_AS_TARGET:
        if getattr(head_config, key, None) != getattr(target_config, key, None):
            raise SpeculativeConfigError(f"the EAGLE head {name} has {key} {getattr(head_config, key, None)}, the "
                                         f"target {getattr(target_config, key, None)}: is it a head for this model?")


def _targets(model: Any, block_index: int) -> Any:
    """The head's names (EAGLE's, the speculators format's) → its parameters; the layer's as the target's layer."""
    def targets(name: str) -> list[Target]:
        name = _our_name(name)
        if name in OWN:
            return [Target(name)]
        if name.startswith(("embed_tokens.", "lm_head.", "transformer.")) or "rotary_emb." in name \
                or name.startswith("layers.0.input_layernorm."):
            return []  # the target's embedding and LM head are used, and no input norm (as vLLM loads these heads)
        if layer_index(name, "layers.") != 0:
            raise SpeculativeConfigError(f"the EAGLE head's tensor {name} is not in EAGLE's layout (fc, layers.0.*)")
        return [Target("block." + t.path.removeprefix(f"layers.{block_index}."), t.part, t.offset)
                for t in model.targets(f"model.layers.{block_index}.{name.removeprefix('layers.0.')}")]
    return targets


def _our_name(name: str) -> str:
    name = name.removeprefix("model.")
    return SPECULATORS_NAMES.get(name, name)
