"""ModelSpec: normalized architecture facts read from config.json (through the family readers
of llmctl.checkpoint.config_readers); plan, inspect and the engine read ModelSpec only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The parts are re-exported: a ModelSpec's fields are typed by them.
from llmctl.checkpoint.architecture import AttentionSpec, LayerLayout, MoESpec, PositionalEncoding, QuantizationSpec
from llmctl.checkpoint.config_readers import (
    FAMILY_READERS,
    ConfigReader,
    read_attention,
    read_llama_like,
    read_positional,
)
from llmctl.checkpoint.delta_net import GatedDeltaNetSpec, gated_delta_net
from llmctl.checkpoint.mamba import Mamba2MixerSpec, mamba2_mixer
from llmctl.checkpoint.mamba1 import Mamba1MixerSpec, mamba1_mixer
from llmctl.checkpoint.quant_schemes import group_schemes
from llmctl.checkpoint.recurrent import RecurrentLayers, recurrent_layers
from llmctl.checkpoint.vision import VisionParams, vision_params

# Where each family deviates from the Llama naming, see FAMILY_READERS below.
CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
DEFAULT_CONTEXT = 2048  # what vLLM assumes when a config names no context length

DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "float16": 2, "half": 2, "fp16": 2,
    "bfloat16": 2, "bf16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1,
}


StateMixer = Mamba2MixerSpec | Mamba1MixerSpec | GatedDeltaNetSpec  # a recurrent layer's shape and state


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    architectures: tuple[str, ...]
    structure: str  # "decoder-only" | "encoder-decoder" | "encoder-only"
    num_layers: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int
    context_source: str  # the config key it came from, or "default"
    attention: AttentionSpec
    positional: PositionalEncoding
    layout: LayerLayout
    activation: str | None
    tie_word_embeddings: bool
    torch_dtype: str | None
    moe: MoESpec | None = None
    quantization: QuantizationSpec | None = None
    auto_map: dict[str, Any] | None = None
    requires_remote_code: bool = False
    mtp_layers: int = 0  # DeepSeek's multi-token-prediction layers, shipped beside the model
    vision: VisionParams | None = None  # a vision-language model's image tower and projector
    recurrent: RecurrentLayers | None = None  # layers with a recurrent state (Mamba, linear attention)
    mixer: StateMixer | None = None  # what the recurrent layers are, when llmctl knows them (Mamba2, gated DeltaNet)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache bytes for one token across all attention layers (recurrent ones keep none), before any
        parallelism."""
        return sum(map(self.attends, range(self.num_layers))) * self.kv_bytes_per_token_layer(dtype_bytes)

    def attends(self, layer: int) -> bool:
        """Whether a layer keeps K/V per token: not one with a recurrent state, nor (Nemotron-H) an MLP block."""
        if self.recurrent is not None and layer in self.recurrent.layers and not self.layout.mixer_beside_attention:
            return False
        blocks = self.layout.blocks
        return blocks is None or (layer < len(blocks) and blocks[layer] == "attention")

    def has_mlp(self, layer: int) -> bool:
        """Whether a layer has an MLP (dense, or experts where moe.moe_layers names it): all but Nemotron-H's
        Mamba and attention blocks."""
        blocks = self.layout.blocks
        return blocks is None or (layer < len(blocks) and blocks[layer] in ("mlp", "moe"))

    def kv_bytes_per_token_layer(self, dtype_bytes: int, kv_heads: int | None = None) -> int:
        """One token, one layer: 2 · kv_heads · head_dim · dtype bytes (kv_heads: per TP rank when given);
        MLA stores one latent of kv_lora_rank + qk_rope_head_dim, the same on every rank."""
        att = self.attention
        if att.kind == "MLA":
            return ((att.kv_lora_rank or 0) + (att.qk_rope_head_dim or 0)) * dtype_bytes
        return 2 * (att.num_kv_heads if kv_heads is None else kv_heads) * att.head_dim * dtype_bytes

    def state_bytes_per_sequence(self, dtype_bytes: int) -> int:
        """The recurrent layers' state one sequence holds, whatever its length (0: no such layers)."""
        if self.recurrent is None or self.mixer is None:
            return 0
        return len(self.recurrent.layers) * self.mixer.state_bytes(dtype_bytes)

    def layer_pattern(self) -> str:
        """Each layer's kind, run-length coded: "5 mamba2, attention, 9 mamba2 …" (+MoE where its MLP routes)."""
        recurrent = dict.fromkeys(self.recurrent.layers) if self.recurrent is not None else {}
        mixer = self.mixer.kind if self.mixer is not None else "recurrent"
        types = self.attention.layer_types
        moe = set(self.moe.moe_layers) if self.moe is not None else set()
        kinds = []
        for layer in range(self.num_layers):
            if not self.attends(layer) and layer not in recurrent:  # Nemotron-H's MLP and MoE blocks
                kinds.append("MoE" if layer in moe else "MLP")
                continue
            kind = {"sliding": "chunked" if self.attention.chunked else "sliding"}.get(
                types[layer] if layer < len(types) else "full", "attention")
            if layer in recurrent:
                kind = f"{mixer}+{kind}" if self.attends(layer) else mixer
            kinds.append(kind + ("+MoE" if layer in moe and self.has_mlp(layer) else ""))
        runs: list[list[Any]] = []
        for kind in kinds:
            if runs and runs[-1][1] == kind:
                runs[-1][0] += 1
            else:
                runs.append([1, kind])
        return ", ".join(kind if count == 1 else f"{count} {kind}" for count, kind in runs)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get((self.torch_dtype or "bfloat16").lower(), 2)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelSpec:
        return build_spec(config)


KNOWN_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "bloom", "opt", "gpt2", "gpt_neox", "falcon", "phi", "phi3", "gemma", "gemma2",
    "gemma3", "gemma3_text", "deepseek_v2", "deepseek_v3", "granite", "olmo2", "qwen2_vl", "qwen2_vl_text",
    "qwen2_5_vl", "qwen2_5_vl_text", "qwen3_vl", "qwen3_vl_text", "glm4_moe", "gpt_oss", "llama4_text",
    "mamba", "falcon_mamba", "jamba", "mamba2", "granitemoehybrid", "nemotron_h", "falcon_h1", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
)


def build_spec(raw_config: dict[str, Any]) -> ModelSpec:
    config, notes = _language_config(raw_config)
    model_type = str(raw_config.get("model_type") or config.get("model_type") or "unknown")
    text_type = str(config.get("model_type") or model_type)
    reader = ConfigReader(config)
    warnings: list[str] = []
    if text_type not in KNOWN_MODEL_TYPES:
        warnings.append(
            f"model_type '{model_type}' is not one llmctl knows: facts were read from common "
            "config keys and may be incomplete"
        )
    family = FAMILY_READERS.get(text_type, read_llama_like)
    facts = family(reader, text_type)
    num_layers = facts["num_layers"]
    attention = read_attention(reader, text_type, facts, num_layers)
    positional = read_positional(reader, text_type, facts)
    context, context_source = _context(config, raw_config)
    if text_type == "qwen" and isinstance(config.get("seq_length"), int) and config["seq_length"] < context:
        # Past its trained context Qwen (1) switches on logn attention and dynamic NTK, which llmctl
        # does not implement: serve only what it computes exactly.
        context, context_source = config["seq_length"], "seq_length"
        notes.append(f"Qwen (1): context capped at seq_length {context}; longer contexts need its logn attention "
                     "and dynamic NTK scaling, which llmctl does not implement")
    if context_source == "default":
        notes.append(f"config names no context length; {DEFAULT_CONTEXT} assumed (vLLM's default)")
    if reader.missing:
        warnings.append("could not find: " + "; ".join(reader.missing))
    recurrent, mixer = _recurrent(config, text_type, num_layers, warnings)
    auto_map = raw_config.get("auto_map")
    return ModelSpec(
        model_type=model_type,
        architectures=tuple(raw_config.get("architectures") or ()),
        structure=_structure(raw_config),
        num_layers=num_layers,
        hidden_size=facts["hidden"],
        intermediate_size=facts["intermediate"],
        vocab_size=int(reader.get("vocab_size", ("vocab_size", "padded_vocab_size"), 0)),
        max_context=context,
        context_source=context_source,
        attention=attention,
        positional=positional,
        layout=facts["layout"],
        activation=facts.get("activation") or config.get("hidden_act") or config.get("activation_function"),
        tie_word_embeddings=reader.flag("tie_word_embeddings", facts.get("tied_default", False)),
        torch_dtype=_dtype(raw_config, config),
        moe=facts.get("moe"),
        quantization=_quantization(raw_config),
        auto_map=auto_map,
        requires_remote_code=bool(auto_map) and not _transformers_knows(model_type),
        mtp_layers=int(config.get("num_nextn_predict_layers") or 0),
        vision=vision_params(raw_config),
        recurrent=recurrent,
        mixer=mixer,
        notes=tuple(notes),
        warnings=tuple(warnings),
    )


def _recurrent(config: dict[str, Any], model_type: str, num_layers: int, warnings: list[str]
               ) -> tuple[RecurrentLayers | None, StateMixer | None]:
    """The layers with a recurrent state and, when llmctl knows them (Mamba2, gated DeltaNet), their shape (else a
    warning)."""
    recurrent = recurrent_layers(config, model_type, num_layers)
    mixer = (mamba2_mixer(config, model_type) or mamba1_mixer(config, model_type)
             or gated_delta_net(config, model_type)) if recurrent is not None else None
    if recurrent is not None and mixer is None:
        warnings.append(f"{recurrent.describe()}: a per-sequence recurrent state, not per-token K/V, which "
                        "llmctl neither serves nor sizes yet — the parameter count and KV bytes here treat those "
                        "layers as attention and are not right")
    return recurrent, mixer


def _language_config(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Multimodal configs nest the language model under text_config."""
    text = raw.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in raw:
        merged = {**raw, **text}
        return merged, ["multimodal checkpoint: facts are the language model's (text_config)"]
    return dict(raw), []


def _structure(config: dict[str, Any]) -> str:
    if config.get("is_encoder_decoder"):
        return "encoder-decoder"
    archs = " ".join(config.get("architectures") or ())
    if any(s in archs for s in ("ForCausalLM", "LMHeadModel")) or "ForConditionalGeneration" in archs:
        return "decoder-only"
    if any(s in archs for s in ("ForMaskedLM", "ForSequenceClassification", "BertModel", "ForTokenClassification")):
        return "encoder-only"
    if config.get("model_type") in ("bert", "roberta", "xlm-roberta", "distilbert", "deberta-v2"):
        return "encoder-only"
    return "decoder-only"


def _context(config: dict[str, Any], raw: dict[str, Any]) -> tuple[int, str]:
    for key in CONTEXT_KEYS:
        for source in (config, raw):
            value = source.get(key)
            if isinstance(value, int) and value > 0:
                return value, key
    return DEFAULT_CONTEXT, "default"


def _dtype(raw: dict[str, Any], config: dict[str, Any]) -> str | None:
    value = raw.get("torch_dtype") or raw.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if value is None:
        if raw.get("bf16"):
            return "bfloat16"
        if raw.get("fp16"):
            return "float16"
    return str(value) if value is not None else None


def _quantization(config: dict[str, Any]) -> QuantizationSpec | None:
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    method = str(quant.get("quant_method") or quant.get("quant_type") or "unknown")
    bits = quant.get("bits") or quant.get("w_bit") or quant.get("num_bits")
    group = quant.get("group_size", quant.get("q_group_size"))
    details = {k: v for k, v in quant.items() if k not in ("quant_method", "bits", "w_bit", "group_size", "q_group_size")}
    if method == "fp8" and bits is None:
        bits = 8
    if method == "compressed-tensors":  # bits and group size live in each config group: given when all agree
        schemes = group_schemes(details)
        bits = schemes[0].bits if schemes and len({s.bits for s in schemes}) == 1 else None
        group = schemes[0].group_size if schemes and len({s.group_size for s in schemes}) == 1 else None
    return QuantizationSpec(method=method, bits=int(bits) if bits else None, group_size=group, details=details)


def _transformers_knows(model_type: str) -> bool:
    try:
        from transformers.models.auto.configuration_auto import (  # type: ignore[attr-defined, unused-ignore]  # not re-exported
            CONFIG_MAPPING_NAMES,
        )
    except Exception:
        return False
    return model_type in CONFIG_MAPPING_NAMES


# ---------------------------------------------------------------- family readers
# Each returns num_layers, hidden, intermediate, heads, kv_heads, head_dim, layout (+ moe).
