"""EngineConfig: the engine's settings under vLLM's names, checked at startup."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmctl.engine.errors import EngineConfigError
from llmctl.engine.front.tracing import check_tracing_available, parse_detailed_traces
from llmctl.engine.multimodal.config import MultimodalLimits, parse_multimodal_limits
from llmctl.engine.pooling.config import CONVERTS, RUNNERS
from llmctl.engine.spec_decode.config import SpeculativeConfig, parse_speculative_config
from llmctl.engine.structured.config import StructuredOutputsConfig, parse_structured_outputs_config
from llmctl.errors import LlmctlError
from llmctl.kernels.limits import SUPPORTED_BLOCK_SIZES
from llmctl.settings import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_SEQS,
    LOAD_FORMATS,
    MODEL_IMPLS,
    SettingError,
    attention_backend,
    kv_cache_format,
    model_dtype,
)
from llmctl.units import GiB

if TYPE_CHECKING:
    from llmctl.engine.distributed.expert_exchange import ReplicaGroup

DEFAULT_CPU_KV_CACHE_MEMORY = 2 * GiB  # vLLM's CPU backend reserves VLLM_CPU_KVCACHE_SPACE (4 GiB) the same way
CPU_KV_CACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's variable: the CPU KV cache in GiB


def parse_json_object(value: str | dict | None, flag: str,
                      example: str = '{"architectures": ["Qwen3ForSequenceClassification"]}') -> dict:
    """A JSON-object flag's value (given as text on the command line, as a dict from Python)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise EngineConfigError(f"{flag} is not JSON ({exc}): pass an object, e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise EngineConfigError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value


def cpu_kv_cache_default() -> int:
    """The CPU KV cache's bytes when --kv-cache-memory is not given: VLLM_CPU_KVCACHE_SPACE GiB where it is
    set (vLLM's variable; fractions taken too; unset or 0 means the default, as in vLLM), else 2 GiB."""
    value = os.environ.get(CPU_KV_CACHE_SPACE_ENV, "").strip()
    try:
        gib = float(value or 0)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib >= 0):
        raise EngineConfigError(f"{CPU_KV_CACHE_SPACE_ENV}={value!r} is not a size in GiB (e.g. 4 or 0.5); unset it "
                                f"for the {DEFAULT_CPU_KV_CACHE_MEMORY // GiB} GiB default, or pass --kv-cache-memory")
    return int(gib * GiB) if gib > 0 else DEFAULT_CPU_KV_CACHE_MEMORY


@dataclass
class EngineConfig:
    model: str | None = None  # hub id, folder, .gguf; None: the default model
    revision: str | None = None
    tokenizer: str | None = None  # vLLM's --tokenizer: a hub id or folder whose tokenizer (and chat template) serve
    load_format: str = "auto"  # vLLM's: auto, safetensors, pt, gguf or dummy (random weights, nothing downloaded)
    quantization: str | None = None  # vLLM's -q: must name the checkpoint's method (llmctl quantizes nothing at load)
    generation_config: str = "auto"  # vLLM's: auto (the model's generation_config.json), vllm (none) or a folder
    max_logprobs: int = 20  # vLLM's: the most logprobs / prompt_logprobs a request may ask for
    dtype: str = "auto"  # auto: bfloat16 on GPU; float32 on CPU, but bfloat16 pooling checkpoints with a bfloat16 GEMM
    max_model_len: int | None = None  # default: the model's context
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None  # default: 2048 on CPU, 8192 on GPU (at least max_model_len unchunked)
    enable_chunked_prefill: bool = True  # False: each prompt computed in one step, as vLLM's --no-enable-chunked-prefill
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    kv_cache_memory: int | None = None  # bytes for the KV cache; CPU default 2 GiB (or VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"  # auto (the model's dtype), bfloat16, float16 or fp8 (e4m3) (vLLM's names)
    attention_backend: str = "auto"  # triton on CUDA, cpu (C++) on CPUs (llmctl.engine.attention_selector)
    seed: int = 0
    enforce_eager: bool = False  # True: no CUDA graphs for uniform steps (llmctl.engine.worker.cuda_graphs)
    enable_sleep_mode: bool = False  # vLLM's: sleep() and wake_up() give memory back (llmctl.engine.worker.sleep)
    graph_buffers_on_cpu: bool = False  # tests, no flag: the CUDA graphs' static-buffer path, run eagerly on CPUs
    async_scheduling: bool = False  # vLLM's: the next step scheduled while one runs (llmctl.engine.executor.overlap)
    device: str = "auto"
    trust_remote_code: bool = False
    model_impl: str = "auto"  # vLLM's --model-impl: auto (native, else transformers), llmctl, transformers
    runner: str = "auto"  # vLLM's --runner: auto (from the checkpoint), generate or pooling
    convert: str = "auto"  # vLLM's --convert: auto, none, embed, classify or reward (a pooling model's task)
    hf_overrides: str | dict | None = None  # vLLM's JSON: config.json fields replaced at load (e.g. architectures)
    pooler_config: str | dict | None = None  # vLLM's JSON: a pooling model's pooling (pooling_type, step_tag_id, …)
    allow_pickle_weights: bool = False  # load pytorch_model*.bin (torch.load weights_only) when no safetensors
    show_progress: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1  # replicas behind one server (llmctl.engine.front.data_parallel)
    distributed_executor_backend: str = "mp"  # TP × PP ranks as spawned processes (mp) or Ray actors (ray)
    data_parallel_backend: str = "mp"  # DP replicas as processes of their own (mp) or as Ray actors (ray)
    enable_expert_parallel: bool = False  # MoE: whole experts spread over TP × DP ranks (EP = TP × DP, as vLLM)
    cpu_threads: int | None = None  # torch threads per rank; default: the cores shared evenly
    # vLLM's JSON flags, as given; validate() parses each once into its dataclass (read through the properties)
    speculative_config: str | dict | SpeculativeConfig | None = None  # None: off
    structured_outputs_config: str | dict | StructuredOutputsConfig | None = None  # {"backend": "auto|xgrammar|…"}
    guided_decoding_backend: str | None = None  # vLLM's older flag for the backend (folded in by validate())
    reasoning_parser: str | None = None  # deepseek_r1 | qwen3: structured outputs start after the reasoning
    scheduling_policy: str = "fcfs"  # or "priority": requests' priority (lower first), then arrival
    enable_lora: bool = False  # per-request PEFT adapters (llmctl.engine.lora)
    max_loras: int = 1  # adapters resident at once (and running at once), as vLLM's default
    max_lora_rank: int = 16  # the slots' rank: larger adapters are refused at load
    limit_mm_per_prompt: str | dict | None = None  # vLLM's JSON, e.g. {"image": 2}; {"image": 0}: text only
    mm_processor_kwargs: str | dict | None = None  # vLLM's JSON, passed to the model's processor
    allowed_local_media_path: str | None = None  # file:// image URLs only below this folder (None: refused)
    allowed_media_domains: list[str] | None = None  # http(s) image URLs only from these hosts (None: any)
    kv_offloading_size: float | None = None  # vLLM's: GiB of CPU memory for evicted KV blocks (core.host_tier)
    kv_offloading_backend: str = "native"  # vLLM's: native (llmctl's own tier); lmcache is not offered
    otlp_traces_endpoint: str | None = None  # vLLM's: a span per finished request, exported there (front.tracing)
    collect_detailed_traces: str | list[str] | tuple[str, ...] | None = None  # vLLM's: model, worker or all
    replica_group: ReplicaGroup | None = None  # set by the data-parallel front: replicas exchanging MoE tokens

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """--speculative-config as validate() parsed it (None: off); parsed here if validate() has not run."""
        return parse_speculative_config(self.speculative_config)

    @property
    def overrides(self) -> dict:
        """--hf-overrides as a dict ({} when not given)."""
        return parse_json_object(self.hf_overrides, "--hf-overrides")

    @property
    def pooler_overrides(self) -> dict:
        """--pooler-config as a dict ({} when not given)."""
        return parse_json_object(self.pooler_config, "--pooler-config", '{"pooling_type": "MEAN"}')

    @property
    def multimodal(self) -> MultimodalLimits:
        return parse_multimodal_limits(self.limit_mm_per_prompt, self.mm_processor_kwargs)

    @property
    def structured_outputs(self) -> StructuredOutputsConfig:
        """--structured-outputs-config (and --guided-decoding-backend) as validate() parsed them."""
        return parse_structured_outputs_config(self.structured_outputs_config, self.guided_decoding_backend)

    def _validate_async_scheduling(self) -> None:
        """--async-scheduling steps one batch ahead: not where batches already overlap or step in rounds."""
        if self.async_scheduling and self.pipeline_parallel_size > 1:
            raise EngineConfigError("--async-scheduling is for --pipeline-parallel-size 1: with more stages their "
                                    "batches in flight already keep every stage busy; drop one of the two flags")
        speculative = parse_speculative_config(self.speculative_config)
        if self.async_scheduling and speculative is not None and speculative.method in ("eagle", "eagle3", "mtp"):
            raise EngineConfigError(f"--async-scheduling does not run with --speculative-config method "
                                    f"{speculative.method} yet: its head reads the hidden states of the step just "
                                    "run, which async scheduling computes on another thread; drop one of the two")
        if self.async_scheduling and self.enable_expert_parallel and self.data_parallel_size > 1:
            raise EngineConfigError("--async-scheduling does not run with --enable-expert-parallel across "
                                    "--data-parallel-size replicas yet: their steps run in lockstep rounds; drop "
                                    "--async-scheduling")

    def _validate_backends(self) -> None:
        """--distributed-executor-backend and --data-parallel-backend are names llmctl knows (vLLM's)."""
        if self.distributed_executor_backend not in ("mp", "ray", "uni"):
            raise EngineConfigError(f"--distributed-executor-backend {self.distributed_executor_backend!r} is not mp "
                                    "(processes spawned on this machine), ray (actors on a Ray cluster) or uni (this "
                                    "one process)")
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise EngineConfigError("--distributed-executor-backend uni runs the model in this one process: use mp or "
                                    "ray for more than one TP or PP rank")
        if self.data_parallel_backend not in ("mp", "ray"):
            raise EngineConfigError(f"--data-parallel-backend {self.data_parallel_backend!r} is not mp (a process per "
                                    "replica) or ray (replicas as actors on a Ray cluster)")

    def _validate_loading(self) -> None:
        """--load-format, --max-logprobs: vLLM's values."""
        if self.load_format not in LOAD_FORMATS:
            raise EngineConfigError(f"--load-format {self.load_format!r} is not one llmctl reads: use "
                                    f"{', '.join(LOAD_FORMATS)}")
        if self.load_format == "pt":  # vLLM's name for the pickled .bin weights
            self.allow_pickle_weights = True
        if self.max_logprobs < 0:
            raise EngineConfigError(f"--max-logprobs must be at least 0 (got {self.max_logprobs}); 20 is the default")

    def _validate_pooling(self) -> None:
        """--runner and --convert are vLLM's names; --hf-overrides is parsed now, before any rank starts."""
        if self.runner not in RUNNERS:
            raise EngineConfigError(f"--runner {self.runner!r} is not one of {', '.join(RUNNERS)}")
        if self.convert not in CONVERTS:
            raise EngineConfigError(f"--convert {self.convert!r} is not one of {', '.join(CONVERTS)}")
        self.overrides  # noqa: B018
        self.pooler_overrides  # noqa: B018

    def _validate_policies(self) -> None:
        """The scheduling policy and the reasoning parser are names llmctl knows."""
        from llmctl.engine.reasoning import ReasoningParserManager

        if self.scheduling_policy not in ("fcfs", "priority"):
            raise EngineConfigError(f"--scheduling-policy {self.scheduling_policy!r} is not fcfs (first come, first "
                                    "served) or priority")
        if self.reasoning_parser is not None:
            try:
                ReasoningParserManager.get_reasoning_parser(self.reasoning_parser)
            except LlmctlError as exc:
                raise EngineConfigError(str(exc)) from None

    def validate(self) -> None:
        def bad(flag: str, message: str) -> None:
            raise EngineConfigError(f"--{flag.replace('_', '-')} {message}")

        try:
            self.dtype = model_dtype(self.dtype).name  # vLLM's aliases (half, float) become the names
            kv_cache_format(self.kv_cache_dtype)
            self.attention_backend = attention_backend(self.attention_backend)
        except SettingError as exc:
            raise EngineConfigError(str(exc)) from None
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            bad("block_size", f"{self.block_size} is not supported; use one of {SUPPORTED_BLOCK_SIZES}")
        if self.max_num_seqs < 1:
            bad("max_num_seqs", f"must be at least 1 (got {self.max_num_seqs}); {DEFAULT_MAX_NUM_SEQS} is the default")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            bad("max_num_batched_tokens", f"must be at least 1 (got {self.max_num_batched_tokens}); try 2048")
        if self.max_model_len is not None and self.max_model_len < 1:
            bad("max_model_len", f"must be at least 1 (got {self.max_model_len})")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            bad("kv_cache_memory", f"must be a positive number of bytes (got {self.kv_cache_memory})")
        if self.kv_cache_memory is None:
            cpu_kv_cache_default()  # a bad VLLM_CPU_KVCACHE_SPACE is one line at startup, before any loading
        if not 0 < self.gpu_memory_utilization <= 1:
            bad("gpu_memory_utilization", f"must be in (0, 1] (got {self.gpu_memory_utilization}); 0.9 is the default")
        for flag in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if getattr(self, flag) < 1:
                bad(flag, f"must be at least 1 (got {getattr(self, flag)})")
        self._validate_backends()
        self._validate_async_scheduling()
        if self.cpu_threads is not None and self.cpu_threads < 1:
            bad("cpu_threads", f"must be at least 1 (got {self.cpu_threads})")
        self._validate_pooling()
        if self.model_impl not in MODEL_IMPLS:
            bad("model_impl", f"{self.model_impl!r} is not one of {', '.join(MODEL_IMPLS)}")
        self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.speculative_config and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            bad("speculative_config", "runs with --tensor-parallel-size 1 and --pipeline-parallel-size 1 for "
                "now; use --data-parallel-size to scale out")  # fails before any rank starts
        try:
            self.structured_outputs_config = parse_structured_outputs_config(self.structured_outputs_config,
                                                                             self.guided_decoding_backend)
            self.multimodal  # noqa: B018 — parsed now, so a bad flag fails before any rank starts
        except LlmctlError as exc:
            raise EngineConfigError(str(exc)) from None
        self._validate_policies()
        if self.enable_lora:
            if self.max_loras < 1:
                bad("max_loras", f"must be at least 1 (got {self.max_loras})")
            if self.max_lora_rank < 1:
                bad("max_lora_rank", f"must be at least 1 (got {self.max_lora_rank}); 16 is the default")
            if self.tensor_parallel_size * self.pipeline_parallel_size > 1:
                bad("enable_lora", "runs with --tensor-parallel-size 1 and --pipeline-parallel-size 1 for now; use "
                    "--data-parallel-size to scale out")
        self._validate_loading()
        self._validate_tracing()
        self._validate_offloading()
        if self.enable_sleep_mode and (self.tensor_parallel_size * self.pipeline_parallel_size > 1
                                       or self.data_parallel_size > 1 or self.speculative_config):
            bad("enable_sleep_mode", "runs in one process without a draft yet: --tensor-parallel-size, "
                "--pipeline-parallel-size and --data-parallel-size 1, no --speculative-config")

    def _validate_tracing(self) -> None:
        self.collect_detailed_traces = parse_detailed_traces(self.collect_detailed_traces) or None
        if self.collect_detailed_traces and not self.otlp_traces_endpoint:
            raise EngineConfigError("--collect-detailed-traces needs tracing: give --otlp-traces-endpoint too (as "
                                    "vLLM requires)")
        if self.collect_detailed_traces and self.async_scheduling and {"model", "all"} & set(
                self.collect_detailed_traces):
            raise EngineConfigError("--collect-detailed-traces model times the forward pass the engine waits for; "
                                    "with --async-scheduling it runs on a thread of its own: use worker instead")
        if self.otlp_traces_endpoint:
            check_tracing_available()

    def _validate_offloading(self) -> None:
        size = self.kv_offloading_size
        if size is not None and not (math.isfinite(size) and size > 0):
            raise EngineConfigError(f"--kv-offloading-size {size}: give the CPU tier's size in GiB, e.g. 8")
        if self.kv_offloading_backend != "native":
            raise EngineConfigError(f"--kv-offloading-backend {self.kv_offloading_backend!r}: llmctl offers "
                                    "native (its own CPU tier) only")
        if size and not self.enable_prefix_caching:
            raise EngineConfigError("--kv-offloading-size keeps prefix-cached KV blocks in CPU memory: it needs "
                                    "prefix caching (leave out --no-enable-prefix-caching)")
