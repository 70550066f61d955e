"""Startup of one process: resolve the model, build it, load and pack its weights, choose the
attention backend, then set up the KV cache (llmctl.engine.worker.kv_cache)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.config_file import load_config
from llmctl.checkpoint.converted_stream import converted
from llmctl.checkpoint.quant_converters import converter_for
from llmctl.checkpoint.source import ModelSource, resolve_model
from llmctl.checkpoint.spec import ModelSpec
from llmctl.checkpoint.tokenizer import load_tokenizer
from llmctl.checkpoint.weights import iterate_tensors, stored_dtypes
from llmctl.engine.attention_selector import BackendChoice, create_backend, engine_backend, torch_fallback
from llmctl.engine.config import EngineConfig
from llmctl.engine.distributed.group import Rank, local_rank
from llmctl.engine.errors import EngineConfigError
from llmctl.engine.gpu_support import check_this_gpu
from llmctl.engine.layers.attention import AttentionBackend
from llmctl.engine.layers.coded_linear import CodedLinear, coded_summary
from llmctl.engine.layers.cpu_gemm import head_small_batch, pack_linears, packed_kernel, repack_panels, small_batch
from llmctl.engine.layers.grouped_attention import GroupedAttention
from llmctl.engine.layers.linear import VocabParallelEmbedding
from llmctl.engine.layers.moe import FusedMoE
from llmctl.engine.layers.quant_linear import QuantLinear
from llmctl.engine.lora.slots import attach_lora_slots
from llmctl.engine.models.common import Shard, WeightMismatchError
from llmctl.engine.models.registry import create_model, is_supported, layer_form
from llmctl.engine.multimodal.processor import serves_images
from llmctl.engine.pooling.config import PoolerConfig, generative_spec, resolve_pooler, with_token_ids
from llmctl.engine.pooling.pooler import adapt_for_pooling
from llmctl.engine.worker.heap import hand_freed_memory_back, keep_freed_memory_in_heap, release_loading_garbage
from llmctl.engine.worker.kv_cache import kv_cache_dtype, set_up_kv_cache
from llmctl.engine.worker.kv_offload import host_kv_pool
from llmctl.engine.worker.load_flags import (
    check_load_flags,
    check_recurrent_flags,
    fill_dummy,
    sampling_defaults,
    tokenizer_source,
)
from llmctl.engine.worker.loaded_model import LoadedModel, Placement
from llmctl.engine.worker.memory_reservation import MemoryReservation
from llmctl.errors import CorruptModelError, UnsupportedModelError
from llmctl.kernels.cpu import CPUKernelsUnavailable
from llmctl.settings import model_dtype
from llmctl.sizing.kv import kv_groups
from llmctl.sizing.memory import max_concurrency
from llmctl.units import GiB

logger = logging.getLogger("llmctl.engine")


def load_model(config: EngineConfig, placement: Placement | None = None) -> LoadedModel:
    """Everything one process needs: with a placement, only its TP shard of its pipeline stage."""
    started = time.perf_counter()
    placement = placement or Placement()
    device = device_for(config.device, placement.rank)
    source = resolve_model(config.model, config.revision, weights=config.load_format != "dummy",
                           show_progress=config.show_progress, gguf_coded=runs_gguf_coded(config, device))
    raw = {**load_config(source), **config.overrides}
    spec = ModelSpec.from_config(raw)
    pooler = resolve_pooler(config.runner, config.convert, spec, source.path, raw, config.pooler_overrides)
    if pooler is not None:  # the family's generative model carries the layers; the pooler replaces its head
        spec = generative_spec(spec)
    _check_native(spec, source, config.trust_remote_code)
    check_load_flags(config, source, spec)
    check_recurrent_flags(config, spec)
    shard, rank = placement.shard(spec), placement.rank
    if device.type == "cpu":
        hand_freed_memory_back()  # until loading ends (llmctl.engine.worker.heap)
    bind_device(device)
    dtype = _dtype(config.dtype, device, spec, pooler)
    choice, backend = _attention_backend(config, spec, device, dtype)  # refuses what this GPU cannot run first
    hf_config = _hf_config(source, spec, config.trust_remote_code)
    for name, value in config.overrides.items():
        setattr(hf_config, name, value)
    tokenizer = None
    if pooler is not None and pooler.from_tokens:  # a classifier head made of these tokens' LM-head rows
        tokenizer = load_tokenizer(tokenizer_source(config, source), trust_remote_code=config.trust_remote_code)
        pooler = with_token_ids(pooler, tokenizer)
    # without images served (a text model, images off, no image processor) no vision tower is built
    hf_config.llmctl_text_only = not serves_images(source.path, spec.model_type, config.multimodal)
    model = _build(spec, hf_config, dtype, device, source, shard, config, pooler)
    tokenizer = tokenizer or load_tokenizer(tokenizer_source(config, source), trust_remote_code=config.trust_remote_code)
    weights_bytes = model_weight_bytes(model)
    packed_bytes = pack_linears(model) if device.type == "cpu" else 0
    lora_step, lora_slots = attach_lora_slots(model, spec, config.max_loras, config.max_lora_rank, dtype, device) \
        if config.enable_lora else (None, {})
    lora_bytes = sum(slots.nbytes for slots in lora_slots.values())
    defaults = sampling_defaults(config, source)
    max_model_len = _max_model_len(config, spec)
    max_batched = _max_batched(config, device, max_model_len)
    groups = kv_groups(spec)
    _check_offloading(config, spec, groups.hybrid)
    if groups.hybrid:  # a backend of the same kind for each further KV group
        backend = GroupedAttention([backend, *(create_backend(backend.name, dtype, spec.attention.head_dim)
                                               for _ in groups.groups[1:])], groups)
    reserved = _draft_reservation(config, device, dtype)
    kv = set_up_kv_cache(config, spec, model, backend, placement, device, dtype, weights_bytes + lora_bytes,
                         max_model_len, max_batched, reserved)
    loaded = LoadedModel(source, spec, hf_config, model, tokenizer, device, dtype, backend, kv.geometry, kv.pool,
                         kv.caches, max_model_len, max_batched, _eos_ids(defaults, tokenizer), defaults, weights_bytes,
                         placement, choice.reason, kv.activation_peak_bytes, packed_bytes, lora_step, lora_slots,
                         pooler, kv.states)
    if config.kv_offloading_size:
        loaded.host_kv = host_kv_pool(config.kv_offloading_size, spec, kv.caches, config.block_size, device)
    if device.type == "cpu":
        release_loading_garbage()
        keep_freed_memory_in_heap()
    if rank.rank == 0:
        _log_startup(loaded, time.perf_counter() - started)
    return loaded


def _check_offloading(config: EngineConfig, spec: ModelSpec, hybrid: bool) -> None:
    """The CPU tier keeps prefix-cached blocks of one KV group: refused, by name, where there are none."""
    if not config.kv_offloading_size:
        return
    reason = ("its layers keep KV groups of different windows" if hybrid else
              "its recurrent layers keep a state per sequence, not per block" if spec.recurrent is not None else
              "with LongRoPE a token's keys depend on its sequence's length"
              if spec.positional.long_rope_switch is not None else None)
    if reason:
        raise EngineConfigError(f"--kv-offloading-size keeps prefix-cached KV blocks in CPU memory; {spec.model_type} "
                                f"has none to keep ({reason}): leave the flag out")


def runs_gguf_coded(config: EngineConfig, device: torch.device) -> bool:
    """A GGUF keeps its quantized weights on a CPU with the C++ kernels, unless a --dtype asks for floats."""
    from llmctl.kernels.cpu import unavailable_reason

    return device.type == "cpu" and config.dtype == "auto" and unavailable_reason() is None


def _check_native(spec: ModelSpec, source: ModelSource, trust_remote_code: bool) -> None:
    """Remote code is never run; a model whose architecture the engine implements natively needs none."""
    if spec.requires_remote_code and not trust_remote_code and not is_supported(spec):
        raise UnsupportedModelError(
            f"{source.name} needs the Python code shipped in its repository (auto_map) and llmctl never runs it "
            "without --trust-remote-code; llmctl's engine also has no implementation of "
            f"{', '.join(spec.architectures) or spec.model_type}")


def model_weight_bytes(model: nn.Module) -> int:
    """Parameters plus packed quantized weights (QuantLinear's buffers, GGUF codes)."""
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    quantized = (QuantLinear, CodedLinear, VocabParallelEmbedding, FusedMoE)
    return dense + sum(m.nbytes for m in model.modules() if isinstance(m, quantized))


def device_for(name: str, rank: Rank) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and rank.world_size > 1:  # one GPU per rank (LOCAL_RANK under torchrun)
        return torch.device("cuda", local_rank(rank) % max(1, torch.cuda.device_count()))
    return torch.device(name)


def _draft_reservation(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> MemoryReservation:
    """On a GPU, what a draft model (loaded after this target) needs is kept out of the target's pool."""
    if device.type != "cuda":
        return MemoryReservation()
    from llmctl.engine.spec_decode.draft_memory import draft_reservation

    return draft_reservation(config, dtype, kv_cache_dtype(config.kv_cache_dtype, dtype))


def bind_device(device: torch.device) -> None:
    """Make this rank's GPU the current one: Triton launches on the current device and stream, so
    without it every rank's kernels would run on GPU 0 with another GPU's pointers."""
    if device.type == "cuda" and device.index is not None:  # plain "cuda" is the current device already
        torch.cuda.set_device(device)


def _dtype(name: str, device: torch.device, spec: ModelSpec, pooler: PoolerConfig | None) -> torch.dtype:
    if name != "auto":
        return getattr(torch, model_dtype(name).torch_name)
    if device.type == "cuda":
        return torch.bfloat16
    if pooler is not None and (spec.torch_dtype or "").lower() == "bfloat16" and _bf16_gemm_here():
        # a bfloat16 embedding model or reranker: prefill-only, so compute-bound, where llmctl's bfloat16 GEMM
        # (AMX tiles, or AVX512-BF16) runs 2-3x float32's; sentence-transformers and vLLM load it in bfloat16 too
        return torch.bfloat16
    return torch.float32  # bfloat16 matmuls are ~200x slower than float32 on CPUs without AMX or AVX512-BF16


def _bf16_gemm_here() -> bool:
    from llmctl.kernels.cpu import bf16_panels_supported

    return bf16_panels_supported()


def _hf_config(source: ModelSource, spec: ModelSpec, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    if spec.model_type == "qwen" and not trust_remote_code:
        return qwen1_config(source)
    try:
        return AutoConfig.from_pretrained(str(source.path), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise CorruptModelError(f"config.json of {source.name} could not be read by transformers: "
                                f"{str(exc).splitlines()[0][:200]}") from None


@contextlib.contextmanager
def _no_init(dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """Build modules without random initialization (every weight is loaded afterwards)."""
    saved = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding, nn.LayerNorm)}
    previous = torch.get_default_dtype()
    try:
        for cls in saved:
            cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
        torch.set_default_dtype(dtype)
        with torch.device(device):
            yield
    finally:
        for cls, method in saved.items():
            cls.reset_parameters = method  # type: ignore[method-assign]
        torch.set_default_dtype(previous)


def qwen1_config(source: ModelSource) -> Any:
    """Qwen (1) ships its config class as remote code: the few fields the engine reads, under Llama's names."""
    import json

    from transformers import PretrainedConfig

    raw = json.loads((source.path / "config.json").read_text())
    raw.pop("auto_map", None)
    raw.update(rope_theta=float(raw.get("rotary_emb_base", 10000.0)),
               rms_norm_eps=float(raw.get("layer_norm_epsilon", 1e-6)))
    return PretrainedConfig(**raw)


def _build(spec: ModelSpec, hf_config: Any, dtype: torch.dtype, device: torch.device, source: ModelSource,
           shard: Shard, config: EngineConfig, pooler: PoolerConfig | None = None) -> nn.Module:
    impl, dummy = config.model_impl, config.load_format == "dummy"
    # no weight files: fail before building
    tensors = None if dummy else iterate_tensors(source.path, dtype, config.allow_pickle_weights)
    stored = stored_dtypes(source.path) if spec.quantization is not None and source.gguf_path is None else {}
    form = layer_form(spec, device.type, impl, shard)
    converter, what = converter_for(source.path, spec.quantization, form, set(stored), dtype, spec.moe is not None) \
        if stored else (None, "")
    if what and tensors is not None:
        logger.info("%s", what)
    if converter is not None and tensors is not None:
        tensors = converted(tensors, converter, stored, dtype, _say_unused)
    with _no_init(dtype, device):
        model = create_model(spec, hf_config, shard, impl, device.type)
        if pooler is not None:
            adapt_for_pooling(model, pooler, shard.is_last)
    if tensors is None:
        fill_dummy(model)
        return model.eval()
    try:
        model.load_weights(tensors)
    except WeightMismatchError as exc:
        raise CorruptModelError(f"the weights of {source.name} do not match its config.json: {exc}") from None
    return model.eval()


def read_weights_again(loaded: LoadedModel, config: EngineConfig) -> None:
    """Sleep level 2's waking (llmctl.engine.worker.sleep): the unquantized checkpoint read again into the same
    layers, and their packed CPU panels made again from it."""
    loaded.model.load_weights(iterate_tensors(loaded.source.path, loaded.dtype, config.allow_pickle_weights))
    if loaded.device.type == "cpu":
        repack_panels(loaded.model)


def _say_unused(names: list[str]) -> None:
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    logger.info("not used: %s (static activation or KV-cache scales: llmctl quantizes neither from a checkpoint's "
                "scales)", shown)


def _max_batched(config: EngineConfig, device: torch.device, max_model_len: int) -> int:
    """Tokens per step: the flag, else 8192 on GPUs and 2048 on CPUs; without chunked prefill, at least one
    whole sequence (vLLM's default then, and its refusal of a smaller flag)."""
    default = 8192 if device.type == "cuda" else 2048
    if config.enable_chunked_prefill:
        return config.max_num_batched_tokens or default
    if config.max_num_batched_tokens is not None and config.max_num_batched_tokens < max_model_len:
        raise EngineConfigError(f"--max-num-batched-tokens {config.max_num_batched_tokens} is less than "
                                f"--max-model-len {max_model_len}: without chunked prefill a prompt of that length "
                                "could never run; raise it, lower --max-model-len, or enable chunked prefill")
    return config.max_num_batched_tokens or max(default, max_model_len)


def _max_model_len(config: EngineConfig, spec: ModelSpec) -> int:
    if config.max_model_len is None:
        return spec.max_context
    if config.max_model_len > spec.max_context:
        raise EngineConfigError(
            f"--max-model-len {config.max_model_len} is longer than the model's context ({spec.max_context}, "
            f"from {spec.context_source}): use --max-model-len {spec.max_context} or less")
    return config.max_model_len


def _eos_ids(defaults: dict[str, Any], tokenizer: Any) -> list[int]:
    value = defaults.get("eos_token_id")
    ids = set(value if isinstance(value, list) else [value] if value is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(int(i) for i in ids)


def _attention_backend(config: EngineConfig, spec: ModelSpec, device: torch.device, dtype: torch.dtype
                       ) -> tuple[BackendChoice, AttentionBackend]:
    """The backend llmctl.engine.attention_selector decides on, built; the C++ kernel's build can still fail."""
    cuda = device.type == "cuda"
    choice = engine_backend(config, spec, cuda, str(dtype).removeprefix("torch."))
    if choice.backend == "triton" and cuda:
        from llmctl.kernels.attention import padded_head_dim, program_rows

        group = spec.attention.num_heads // spec.attention.num_kv_heads
        check_this_gpu(device, dtype, config.kv_cache_dtype, padded_head_dim(spec.attention.head_dim),
                       program_rows(group, decode_only=False))
    if choice.backend != "cpu":
        return choice, create_backend(choice.backend)
    try:
        return choice, create_backend("cpu", dtype, spec.attention.head_dim)
    except CPUKernelsUnavailable as exc:
        if config.attention_backend == "cpu":
            raise EngineConfigError(f"--attention-backend cpu: {exc}; or use --attention-backend torch") from None
        logger.warning("%s; attending with torch SDPA instead", exc)
        return torch_fallback(spec, str(exc)), create_backend("torch")


def _rows(count: int) -> str:
    return f"{count} row{'' if count == 1 else 's'}"


def _pooling_head(pooler: PoolerConfig) -> str:
    if pooler.from_tokens:
        return "a head of the LM-head rows of " + ", ".join(pooler.from_tokens)
    if pooler.labels:
        return "the LM head dropped, the checkpoint's score head on " + ("each row" if pooler.task == "reward" else
                                                                         "the pooled state")
    return "the LM head dropped"


def _log_startup(loaded: LoadedModel, seconds: float) -> None:
    pool, geometry = loaded.kv_pool, loaded.kv_geometry
    concurrency = max_concurrency(pool, geometry, loaded.max_model_len, loaded.max_num_batched_tokens)
    logger.info("model %s (%s), dtype %s on %s", loaded.source.name, ", ".join(loaded.spec.architectures),
                str(loaded.dtype).removeprefix("torch."), loaded.device)
    if loaded.kv_caches:
        logger.info("attention backend %s: %s", loaded.backend.name, loaded.attention_reason)
    if loaded.pooler is not None:
        head = _pooling_head(loaded.pooler)
        logger.info("pooling runner: %s (%s; requests are prefill-only)", loaded.pooler.describe(), head)
    where = " on rank 0 (every rank is listed below)" if loaded.placement.rank.world_size > 1 else ""
    rows, head_rows = small_batch(), head_small_batch()
    head = f", the LM head from {_rows(head_rows)}" if head_rows and head_rows != rows else ""
    packed = (f" (+{loaded.packed_bytes / GiB:.2f} GiB packed for {packed_kernel()}, used from {_rows(rows)} "
              f"on{head}: measured on this CPU)") if loaded.packed_bytes else ""
    logger.info("weights take %.2f GiB%s%s", loaded.weights_bytes / GiB, packed, where)
    if loaded.source.gguf_path is not None:
        coded = coded_summary(loaded.model)
        logger.info("GGUF %s: %s", loaded.source.gguf_path.name,
                    f"kept quantized, {coded}" if coded else
                    f"dequantized to {str(loaded.dtype).removeprefix('torch.')} (the CPU engine keeps GGUF weights "
                    "quantized unless --dtype is given)")
    if loaded.lora_slots:
        config_slots = next(iter(loaded.lora_slots.values()))
        max_loras, max_rank = config_slots.a.shape[0], config_slots.a.shape[2]
        logger.info("LoRA: %d adapter slot%s of rank ≤ %d take %.3f GiB (q/k/v/o and gate/up/down of every layer)",
                    max_loras, "" if max_loras == 1 else "s", max_rank, loaded.lora_bytes / GiB)
    slots = loaded.states.slots if loaded.states is not None else 0
    if loaded.states is not None:
        label = loaded.spec.mixer.label if loaded.spec.mixer is not None else "recurrent"
        logger.info("recurrent state%s: %.3f GiB = %d sequence slots in %d %s layers, a fixed state per sequence "
                    "whatever its length", where, loaded.states.nbytes / GiB, slots, len(loaded.states.layers), label)
    if not loaded.kv_caches:
        logger.info("KV cache: none (no attention layers); at most %d sequences at once", slots)
        logger.info("loaded in %.2f s", seconds)
        return
    logger.info("KV cache%s: %.2f GiB = %d blocks of %d tokens in %s; %s KV cache size: %s tokens", where,
                pool.allocated_bytes / GiB, pool.num_blocks, pool.block_size,
                _cache_dtype_name(loaded),
                "GPU" if loaded.device.type == "cuda" else "CPU", f"{pool.tokens:,}")
    logger.info("Maximum concurrency for %s tokens per request: %.2fx", f"{loaded.max_model_len:,}", concurrency)
    logger.info("loaded in %.2f s", seconds)


def _cache_dtype_name(loaded: LoadedModel) -> str:
    caches = list(loaded.kv_caches.values())
    return str(caches[0].kv.dtype).removeprefix("torch.") if caches else "no attention layers"
