"""The multi-token-prediction layer of DeepSeek-V3 (and its kind: Kimi K2) or GLM-4.5 as the drafter
(--speculative-config '{"method": "mtp", "num_speculative_tokens": k}'; vLLM's older "deepseek_mtp" too), read
from the target's own checkpoint (`model.layers.{num_hidden_layers}.*`, the same names in both) and run as vLLM
runs both: the token's embedding (zero at position 0) and the target's final hidden state, each normed (`enorm`,
`hnorm`), joined by `eh_proj`, through one more decoder layer of the target's kind (latent attention or GLM's
attention, mixture of experts) with its own KV cache, then `shared_head` (norm, LM head).
Chained drafts reuse the layer on its own output (vLLM does the same with one MTP layer); the hidden-state proposer
(llmctl.engine.spec_decode.hidden_proposer) drives it."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.weights import iterate_tensors
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import SpeculativeConfigError
from llmctl.engine.layers.attention import KVCache
from llmctl.engine.layers.norms import RMSNorm
from llmctl.engine.models.common import StepContext, Target, layer_index, load_checkpoint
from llmctl.engine.spec_decode.hidden_proposer import HEAD_LAYER, HiddenStateProposer
from llmctl.engine.worker.loaded_model import LoadedModel

logger = logging.getLogger("llmctl.engine")
FAMILIES = ("glm4_moe",)  # beside DeepSeek's latent-attention models
OWN = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
       "shared_head.norm.weight": "shared_head_norm.weight", "shared_head.head.weight": "shared_head.weight"}


class MtpLayer(nn.Module):
    def __init__(self, target: Any, hf_config: Any, block_index: int) -> None:
        super().__init__()
        spec, eps = target.spec, float(getattr(hf_config, "rms_norm_eps", 1e-6))
        h = spec.hidden_size
        self.enorm, self.hnorm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.block = target.make_layer(block_index, hf_config, target.make_rotary(hf_config, spec.attention.head_dim),
                                       eps)
        self.shared_head_norm = RMSNorm(h, eps)
        self.shared_head = nn.Linear(h, spec.vocab_size, bias=False)
        self.target_embed = target.embed  # a bound method: the target's embedding, not a submodule
        self.prenorm: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        assert hidden is not None, "a draft step reads the target's hidden states or the step before's"
        embeds = torch.where((ctx.positions == 0).unsqueeze(-1), 0.0, self.target_embed(input_ids))
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        self.prenorm = self.block(x, ctx, HEAD_LAYER)
        return self.shared_head_norm(self.prenorm)

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        return self.shared_head(normed).float()


def mtp_proposer(config: EngineConfig, target: LoadedModel, generator: torch.Generator) -> HiddenStateProposer:
    spec, model = target.spec, target.model
    if not spec.mtp_layers or not hasattr(model, "keep_last_hidden") or \
            not (spec.attention.kind == "MLA" or spec.model_type in FAMILIES):
        raise SpeculativeConfigError(f"--speculative-config method mtp reads the multi-token-prediction layers of "
                                     f"DeepSeek-V3 and GLM-4.5 checkpoints; {spec.model_type} has none llmctl runs "
                                     "(config.json's num_nextn_predict_layers)")
    if spec.quantization is not None:
        raise SpeculativeConfigError("method mtp reads unquantized checkpoints so far; this one is "
                                     f"{spec.quantization.method}")
    layer = _load_layer(config, target)
    setattr(model, "keep_last_hidden", True)  # noqa: B010 — the target keeps its final hidden states each step
    cache = KVCache(torch.zeros_like(next(iter(target.kv_caches.values())).kv))  # one more layer of the target's kind
    return HiddenStateProposer(layer, cache, target, lambda: model.last_hidden, config.block_size, generator)


def _load_layer(config: EngineConfig, target: LoadedModel) -> MtpLayer:
    """The first MTP layer; its decoder block built and loaded as the target's layer of the same kind is."""
    model: Any = target.model
    spec, mtp_index = target.spec, target.spec.num_layers
    moe = spec.moe is not None and mtp_index >= min(spec.moe.moe_layers, default=mtp_index + 1)
    kind = [i for i in model.stage_layers if (i in (spec.moe.moe_layers if spec.moe else ())) == moe]
    if not kind:
        raise SpeculativeConfigError("the MTP layer's decoder block has no layer of its kind in the target")
    block_index = kind[-1]
    layer = MtpLayer(model, target.hf_config, block_index)
    tensors = list(iterate_tensors(target.source.path, target.dtype, config.allow_pickle_weights))
    if not any(layer_index(t.name, "layers.") == mtp_index for t in tensors):
        raise SpeculativeConfigError(f"config.json names {spec.mtp_layers} multi-token-prediction layer(s) but the "
                                     f"checkpoint ships no model.layers.{mtp_index}.* tensors: use a checkpoint "
                                     "with its MTP weights, or another speculative method")

    def targets(name: str) -> list[Target]:
        if layer_index(name, "layers.") != mtp_index:
            return []
        rest = name.removeprefix("model.").removeprefix(f"layers.{mtp_index}.")
        if rest in OWN:
            return [Target(OWN[rest])]
        if rest.startswith("embed_tokens."):  # a copy of the target's
            return []
        return [Target("block." + t.path.removeprefix(f"layers.{block_index}."), t.part, t.offset)
                for t in model.targets(f"model.layers.{block_index}.{rest}")]

    load_checkpoint(layer, tensors, targets)
    layer.to(device=target.device, dtype=target.dtype)
    logger.info("multi-token prediction: layer %d of %s drafts (its block: %s attention, %s)", mtp_index,
                target.source.name, "latent" if spec.attention.kind == "MLA" else "grouped-query",
                "experts" if moe else "a dense MLP")
    return layer
