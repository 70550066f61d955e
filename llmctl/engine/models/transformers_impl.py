"""`--model-impl transformers`: a causal LM built by transformers, run inside llmctl's engine.

transformers' modules compute embeddings, positions, norms and MLPs; attention goes through llmctl's
paged KV cache by a function registered with transformers' AttentionInterface. One step's tokens (all
sequences, flattened) run as a batch of one: llmctl's attention backend separates the sequences from
the step's metadata, so transformers builds no causal mask (no mask function is registered). As vLLM's
transformers backend, this needs a model class that supports the attention interface.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.layers.attention import soft_cap
from llmctl.engine.models.common import Shard, StepContext
from llmctl.errors import UnsupportedModelError

ATTENTION_NAME = "llmctl_paged"
BIDIRECTIONAL = "<bidirectional>"  # what the probe records of a layer whose attention is not causal
REPEATED = "<called twice>"  # ... and of a layer that calls attention more than once per step


def kv_shape(kv_heads: int, head_dim: int) -> str:
    """What the probe records of the K a layer attends with."""
    return f"<kv {kv_heads} x {head_dim}>"
_STEP: contextvars.ContextVar[StepContext] = contextvars.ContextVar("llmctl_step")
_PROBE: contextvars.ContextVar[dict[int, set[str]]] = contextvars.ContextVar("llmctl_probe")
# config.json's layer_types that are attention over a K/V cache llmctl's paged attention holds
ATTENTION_LAYER_KINDS = {"full_attention", "sliding_attention", "attention"}
# what transformers passes to an attention function that llmctl's implements or that changes nothing here
IMPLEMENTED_ATTENTION_ARGS = {"dropout", "scaling", "sliding_window", "softcap", "position_ids", "cache_position",
                              "use_cache", "output_attentions", "is_causal", "past_key_values", "past_key_value"}


def transformers_class(spec: ModelSpec) -> tuple[type | None, str]:
    """The transformers class for the checkpoint's architecture, or None and why it cannot run here."""
    import transformers

    names = spec.architectures or []
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        if not getattr(cls, "_supports_attention_backend", False):
            return None, f"no attention-interface support in transformers for {name}"
        return (None, why) if (why := _paged_attention_lacks(spec)) else (cls, "")
    return None, f"transformers has no class {', '.join(names) or spec.model_type} (or it needs --trust-remote-code)"


def _paged_attention_lacks(spec: ModelSpec) -> str:
    """What llmctl's paged attention cannot do for this model yet, or ''."""
    att = spec.attention
    if att.kind == "MLA":
        return "multi-head latent attention needs its own KV layout, which llmctl's engine does not have yet"
    return ""


def _layer_kinds_lacking(hf_config: Any) -> str:
    """The layer kinds in config.json's layer_types that are not attention over a plain K/V cache, or ''."""
    config = getattr(hf_config, "text_config", None) or hf_config
    kinds = getattr(config, "layer_types", None) or []
    other = sorted({str(kind) for kind in kinds} - ATTENTION_LAYER_KINDS)
    if not other:
        return ""
    layers = [i for i, kind in enumerate(kinds) if kind in other]
    return (f"layers {layers[:8]} are {', '.join(other)}, which llmctl's paged attention does not compute "
            "(chunked attention needs its own mask; linear attention and Mamba keep a recurrent state)")


def paged_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention call, [1, H, T, D] in and [1, T, H, D] out, on llmctl's paged cache."""
    probe = _PROBE.get(None)
    if probe is not None:  # a load-time probe: which layers attend, and with what
        seen = probe.setdefault(module.layer_idx, set())
        if seen:  # a second call of one layer (DiffLlama): each would store its own V into the layer's one cache
            seen.add(REPEATED)
        seen.update(name for name, value in kwargs.items() if value is not None)
        if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
            seen.add(BIDIRECTIONAL)
        seen.add(kv_shape(key.shape[1], key.shape[-1]))
        return torch.zeros(*query.shape[:1], query.shape[2], query.shape[1], value.shape[-1], dtype=query.dtype,
                           device=query.device), None
    ctx = _STEP.get()
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = ctx.backend.forward(q, k, v, ctx.kv_caches[module.layer_idx], scale=float(scale),
                              window=kwargs.get("sliding_window"), softcap=kwargs.get("softcap"))
    return out.unsqueeze(0), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)


class TransformersForCausalLM(nn.Module):
    """The engine's model interface around a transformers model (one process: no TP or PP yet)."""

    supports_lora = False

    def __init__(self, spec: ModelSpec, hf_config: Any, shard: Shard | None = None) -> None:
        super().__init__()
        shard = shard or Shard()
        if shard.group.size > 1 or not (shard.is_first and shard.is_last):
            raise UnsupportedModelError("--model-impl transformers runs in one process: use --tp 1 --pp 1 "
                                        "(or --dp for more replicas)")
        cls, why = transformers_class(spec)
        if cls is None:
            raise UnsupportedModelError(why)
        if why := _layer_kinds_lacking(hf_config):
            raise UnsupportedModelError(f"--model-impl transformers: {why}")
        _register()
        # transformers reads the checkpoint itself: its key renamings and tensor conversions apply
        self.hf = cls.from_pretrained(hf_config._name_or_path, config=hf_config, attn_implementation=ATTENTION_NAME,
                                      dtype=torch.get_default_dtype()).to(torch.get_default_device())
        self.spec, self.shard = spec, shard
        self.stage_layers = range(spec.num_layers)
        self._check_layer_indices()
        if why := self._probe_attention():
            raise UnsupportedModelError(f"--model-impl transformers: {why}")

    def _check_layer_indices(self) -> None:
        indices = {getattr(m, "layer_idx", None) for m in self.hf.modules() if hasattr(m, "layer_idx")}
        if indices != set(self.stage_layers):
            raise UnsupportedModelError(f"--model-impl transformers: {type(self.hf).__name__}'s attention modules do not carry layer "
                                        "indices llmctl can map to its KV cache")

    def _probe_attention(self) -> str:
        """Run one token and watch every attention call: a layer that never calls it keeps a state other
        than K/V (Mamba, linear attention), and an argument llmctl's attention does not implement (gpt-oss's
        sinks, `s_aux`) would be dropped. Either is a wrong answer, so it is refused here, by layer."""
        calls: dict[int, set[str]] = {}
        token = _PROBE.set(calls)
        name = type(self.hf).__name__
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.hf.device)
        try:
            with torch.no_grad():
                out = self.hf.base_model(input_ids=ids, position_ids=ids, use_cache=False)
        except Exception as exc:  # noqa: BLE001 (any failure of transformers' own forward means: not servable)
            return f"{name}'s forward fails around llmctl's attention ({type(exc).__name__}: {exc})"
        finally:
            _PROBE.reset(token)
        if not hasattr(out, "last_hidden_state"):
            return f"{name}'s base model returns no hidden states ({type(out).__name__})"
        return self._refusal(name, calls)

    def _refusal(self, name: str, calls: dict[int, set[str]]) -> str:
        """What the probe's record of the attention calls says llmctl's paged attention cannot reproduce, or ''."""
        silent = sorted(set(self.stage_layers) - set(calls))
        if silent:
            return (f"{name}'s layers {silent[:8]} do not attend through transformers' attention interface (a "
                    "recurrent or convolutional state llmctl's KV cache does not hold)")
        twice = sorted(layer for layer, names in calls.items() if REPEATED in names)
        if twice:
            return (f"{name}'s layers {twice[:8]} call attention more than once per step (over one K/V cache llmctl "
                    "would overwrite between the calls)")
        both_ways = sorted(layer for layer, names in calls.items() if BIDIRECTIONAL in names)
        if both_ways:
            return (f"{name}'s attention in layers {both_ways[:8]} is bidirectional (is_causal false: an encoder, or "
                    "a decoder whose config lacks is_decoder true), and llmctl's paged attention is causal")
        cache = kv_shape(self.spec.attention.num_kv_heads, self.spec.attention.head_dim)
        other_shape = sorted(layer for layer, names in calls.items() if cache not in names)
        if other_shape:
            return (f"{name}'s layers {other_shape[:8]} attend with K/V heads of another count or size than the "
                    f"cache's {self.spec.attention.num_kv_heads} × {self.spec.attention.head_dim} (heads sized per kind of "
                    "layer; the paged cache has one size)")
        markers = {REPEATED, BIDIRECTIONAL} | {n for names in calls.values() for n in names if n.startswith("<kv ")}
        extra = sorted(set().union(*calls.values()) - IMPLEMENTED_ATTENTION_ARGS - markers)
        if extra:
            sinks = " (attention sinks)" if "s_aux" in extra else ""
            return (f"{name} passes {', '.join(extra)}{sinks} to its attention function, which llmctl's paged "
                    "attention does not implement")
        return ""

    def forward(self, input_ids: torch.Tensor, ctx: StepContext, hidden: torch.Tensor | None = None) -> torch.Tensor:
        token = _STEP.set(ctx)
        try:
            out = self.hf.base_model(input_ids=input_ids.unsqueeze(0), position_ids=ctx.positions.unsqueeze(0),
                                     use_cache=False)
        finally:
            _STEP.reset(token)
        return out.last_hidden_state[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head, then what the families' own forward does to its output (read from their configs)."""
        logits = self.hf.get_output_embeddings()(hidden)[..., :self.spec.vocab_size]
        config = getattr(self.hf.config, "text_config", None) or self.hf.config
        if getattr(config, "logits_scaling", None):  # Granite
            logits = logits / config.logits_scaling
        if isinstance(getattr(self.hf, "logit_scale", None), float):  # Cohere
            logits = logits * self.hf.logit_scale
        cap = getattr(config, "final_logit_softcapping", None)  # Gemma 2 and 3
        return soft_cap(logits, cap) if cap else logits

    def load_weights(self, tensors: list[CheckpointTensor] | Any) -> None:
        """Nothing to do: transformers' from_pretrained loaded (and checked) the checkpoint."""
