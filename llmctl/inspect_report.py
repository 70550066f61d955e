"""Everything `llmctl inspect` knows about a model, gathered from its metadata files only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmctl.checkpoint.config_file import load_config, load_spec
from llmctl.checkpoint.gguf_convert import GgufTensorType, gguf_tensor_types
from llmctl.checkpoint.license import LicenseReport, detect_license
from llmctl.checkpoint.params import ConfigParamCount, TensorCount, count_from_config, count_from_tensors
from llmctl.checkpoint.pooling import ENCODER_TYPES, PoolingSpec, pooling_spec
from llmctl.checkpoint.safetensors import WeightHeaders, read_weight_headers
from llmctl.checkpoint.source import ModelSource
from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.tokenizer import (
    TokenizerFacts,
    describe_tokenizer,
    generation_defaults,
    tokenize_text,
    try_load_tokenizer,
)
from llmctl.checkpoint.vision import VisionTower, vision_tower
from llmctl.engine.attention_selector import BackendChoice, choose_attention_backend
from llmctl.engine.models.registry import implementation
from llmctl.engine.pooling.config import generative_spec
from llmctl.errors import LlmctlError


@dataclass
class WeightsSummary:
    """Parameter counts and bytes, from safetensors headers where possible, else the config."""

    origin: str  # where the exact numbers come from
    params: int | None  # the best count: headers when read, else config
    params_from_headers: int | None
    params_from_config: int | None
    active_params: int | None  # per token (MoE routes to top-k experts)
    counts_agree: bool | None
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    total_bytes: int | None = None
    index_total_size: int | None = None
    buffer_elements: int = 0
    quant_metadata_elements: int = 0
    mtp_params: int = 0
    note: str | None = None


@dataclass
class InspectReport:
    source: ModelSource
    spec: ModelSpec
    config_params: ConfigParamCount | None
    weights: WeightsSummary
    kv_bytes_per_token_16bit: int
    kv_bytes_per_token_model_dtype: int
    tokenizer: TokenizerFacts
    generation_defaults: dict[str, Any]
    license: LicenseReport
    backend: BackendChoice
    llmctl_serves: bool  # `llmctl serve` runs it (else: vLLM serves it, llmctl does not yet)
    implementation: str | None  # with what: "llmctl" (native), "transformers" (--model-impl), or None
    implementation_note: str  # why neither, when None
    text_tokens: list[tuple[int, str]] | None = None
    warnings: list[str] = field(default_factory=list)
    gguf_tensor_types: list[GgufTensorType] | None = None  # a GGUF file's types, their shares and bytes
    vision: VisionTower | None = None  # a vision-language model's image tower
    pooling: PoolingSpec | None = None  # an embedding, classifier or reward model's task and pooling


def build_inspect_report(source: ModelSource, *, text: str | None = None,
                         trust_remote_code: bool = False) -> InspectReport:
    spec = load_spec(source)
    config_count = count_from_config(spec)
    headers = read_weight_headers(source)
    weights = summarize_weights(spec, config_count, headers)
    # transformers' tokenizer (and torch with it) only to tokenize --text: the facts need tokenizer.json alone
    loaded, why_not = try_load_tokenizer(source, trust_remote_code=trust_remote_code, light=text is None)
    tokenizer = describe_tokenizer(source, spec.model_type, spec.vocab_size, loaded, why_not)
    text_tokens = None
    if text is not None:
        if loaded is None:
            raise LlmctlError(f"cannot tokenize --text: {why_not or 'the tokenizer could not be loaded'}")
        text_tokens = tokenize_text(loaded, text)  # the tokenizer loaded above, not a second load
    warnings = list(spec.warnings)
    if spec.requires_remote_code and not trust_remote_code:
        warnings.append("this model needs remote code (auto_map); llmctl never runs it unless you pass "
                        "--trust-remote-code")
    if weights.counts_agree is False:
        warnings.append(f"parameter count from headers ({weights.params_from_headers:,}) differs from the "
                        f"config-derived count ({weights.params_from_config:,})")
    license_report = detect_license(source)
    pooling = pooling_spec(source.path, load_config(source)) if source.gguf_path is None else None
    impl, why, backend = served_as(spec, pooling)
    return InspectReport(
        source=source, spec=spec, config_params=config_count, weights=weights,
        kv_bytes_per_token_16bit=spec.kv_bytes_per_token(2),
        kv_bytes_per_token_model_dtype=spec.kv_bytes_per_token(spec.dtype_bytes),
        tokenizer=tokenizer, generation_defaults=generation_defaults(source),
        license=license_report, backend=backend,
        llmctl_serves=impl is not None, implementation=impl, implementation_note=why,
        text_tokens=text_tokens, warnings=warnings,
        gguf_tensor_types=gguf_tensor_types(source.gguf_path) if source.gguf_path else None,
        vision=vision_tower(load_config(source), headers.tensors) if source.gguf_path is None else None,
        pooling=pooling,
    )


ENCODER_BACKEND = BackendChoice("transformers", "an encoder runs whole through transformers' own modules and "
                                "attention: no paged KV cache")


def served_as(spec: ModelSpec, pooling: PoolingSpec | None) -> tuple[str | None, str, BackendChoice]:
    """How `llmctl serve` runs the checkpoint (implementation, why not, attention backend): an encoder through
    transformers' modules; a decoder pooling model on the native layers of its generative sibling."""
    if pooling is not None and spec.model_type in ENCODER_TYPES:
        return "encoder", "", ENCODER_BACKEND
    served = generative_spec(spec) if pooling is not None else spec
    impl, why = implementation(served)
    return impl, why, choose_attention_backend(served)


def summarize_weights(spec: ModelSpec, config_count: ConfigParamCount | None, headers: WeightHeaders) -> WeightsSummary:
    from_config = config_count.total if config_count else None
    active = config_count.active if config_count else None
    if headers.tensors:
        counted: TensorCount = count_from_tensors(headers.tensors, spec)
        agree = None if from_config is None else counted.total == from_config
        return WeightsSummary(
            origin=headers.origin, params=counted.total, params_from_headers=counted.total,
            params_from_config=from_config, active_params=active, counts_agree=agree,
            bytes_by_dtype=counted.bytes_by_dtype, total_bytes=counted.total_bytes,
            index_total_size=headers.index_total_size, buffer_elements=counted.buffers,
            quant_metadata_elements=counted.quant_metadata, mtp_params=counted.mtp,
        )
    dtype = spec.torch_dtype or "bfloat16"
    total_bytes = headers.index_total_size
    note = "computed from config.json"
    if headers.reason:
        note += f" (safetensors headers unavailable: {headers.reason})"
    rotary = sum(1 for name in headers.index_tensor_names if name.endswith("rotary_emb.inv_freq"))
    if rotary:
        note += f"; the index also lists {rotary} rotary inv_freq buffers (not parameters)"
    if total_bytes is None and from_config is not None and spec.quantization is None:
        total_bytes = from_config * spec.dtype_bytes
        note += f"; bytes estimated at {spec.dtype_bytes} per parameter ({dtype})"
    elif total_bytes is None and spec.quantization is not None:
        note += "; bytes not estimated: quantized checkpoint without headers or index"
    label = spec.torch_dtype or "dtype not stated"
    return WeightsSummary(
        origin="config" if headers.origin == "none" else f"config + {headers.origin}",
        params=from_config, params_from_headers=None, params_from_config=from_config, active_params=active,
        counts_agree=None, bytes_by_dtype={label: total_bytes} if total_bytes else {}, total_bytes=total_bytes,
        index_total_size=headers.index_total_size,
        mtp_params=config_count.mtp if config_count else 0, note=note,
    )
