"""The engine's command-line flags, declared once for EngineConfig's fields (as vLLM's
EngineArgs.add_cli_args): `@with_engine_flags()` adds them to every command that builds an
engine (serve, bench offline) and hands it an EngineFlags that makes the config. The
defaults are EngineConfig's own, so the flags and the library cannot disagree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from llmctl.cli.common import parse_bytes, parse_count
from llmctl.cli.flags import F, Flag, FlagGroup, with_flags
from llmctl.engine.config import EngineConfig
from llmctl.settings import DTYPES, kv_cache_help

ENGINE_FLAGS: dict[str, Flag] = {  # EngineConfig field -> its flag, in --help order
    "max_model_len": Flag(("--max-model-len",), Optional[str], "context per sequence: tokens, or vLLM's 32k "
                          "(32,000) or 32K (32,768)", parse=lambda value: parse_count(value, "--max-model-len")),
    "max_num_seqs": Flag(("--max-num-seqs",), int, "sequences per step"),
    "max_num_batched_tokens": Flag(("--max-num-batched-tokens",), Optional[int], "tokens per step"),
    "enable_chunked_prefill": Flag(("--enable-chunked-prefill",), bool, "long prompts computed in chunks over steps, "
                                   "beside other sequences' decodes; off: each prompt in one step (then "
                                   "--max-num-batched-tokens is at least --max-model-len)"),
    "dtype": Flag(("--dtype",), str, f"{', '.join(DTYPES)} (auto: bfloat16 on GPUs; float32 on CPUs, but a "
                  "bfloat16 pooling checkpoint in bfloat16 where the CPU has AMX or AVX512-BF16)"),
    "gpu_memory_utilization": Flag(("--gpu-memory-utilization",), float),
    "kv_cache_memory": Flag(("--kv-cache-memory-bytes", "--kv-cache-memory"), Optional[str],
                            "KV cache size per rank, e.g. 4GiB or vLLM's 4G (CPU default: VLLM_CPU_KVCACHE_SPACE GiB, else 2GiB)",
                            parse=lambda value: parse_bytes(value, "--kv-cache-memory")),
    "enable_prefix_caching": Flag(("--enable-prefix-caching/--no-enable-prefix-caching",), bool),
    "seed": Flag(("--seed",), int),
    "block_size": Flag(("--block-size",), int, "tokens per KV-cache block: 8, 16, 32 or 64"),
    "tensor_parallel_size": Flag(("--tensor-parallel-size", "--tp", "-tp"), int, "ranks each layer is split over"),
    "pipeline_parallel_size": Flag(("--pipeline-parallel-size", "--pp", "-pp"), int, "stages the layers are split into"),
    "data_parallel_size": Flag(("--data-parallel-size", "--dp", "-dp"), int, "engine replicas behind one server"),
    "distributed_executor_backend": Flag(("--distributed-executor-backend",), str, "how the TP × PP ranks run: mp "
                                         "(processes on this machine), ray (actors on the Ray cluster `ray start` "
                                         "made, or RAY_ADDRESS's; else a local one), or uni (one rank, in this "
                                         "process)"),
    "data_parallel_backend": Flag(("--data-parallel-backend", "-dpb"), str, "where the --dp replicas run: mp (a "
                                  "process each, on this machine) or ray (as actors on the Ray cluster, across its "
                                  "nodes; a lost replica leaves the others serving)"),
    "enable_expert_parallel": Flag(("--enable-expert-parallel",), bool, "mixture-of-experts models: whole experts "
                                   "spread over the TP × DP ranks instead of every expert split (EP = TP × DP, as "
                                   "vLLM; with --dp the replicas step together)"),
    "cpu_threads": Flag(("--cpu-threads",), Optional[int], "torch threads per rank, fixed (default: the CPU cores "
                                                           "shared evenly; one rank uses fewer while other "
                                                           "processes keep cores busy)"),
    "attention_backend": Flag(("--attention-backend",), str, "auto (triton on CUDA; on CPUs llmctl's C++ kernel, "
                                                             "cpu; MLA models: mla), cpu, torch or triton"),
    "kv_cache_dtype": Flag(("--kv-cache-dtype",), str, kv_cache_help()),
    "enforce_eager": Flag(("--enforce-eager",), bool, "no CUDA graphs (captured on CUDA with the triton backend, "
                                                      "PP 1, for decode and speculative verification steps)"),
    "enable_sleep_mode": Flag(("--enable-sleep-mode",), bool, "POST /sleep?level=1 (the KV cache given back, "
                              "the weights kept in CPU memory) or level=2 (the weights given back too, read again "
                              "on waking), POST /wake_up, GET /is_sleeping, as vLLM's; one process"),
    "async_scheduling": Flag(("--async-scheduling",), bool, "model steps on a thread of their own: the next step "
                             "is scheduled, and the last one's outputs made, while one runs (vLLM's flag; steps "
                             "with grammars, penalties, bad words or speculative decoding still wait for their "
                             "tokens; not with --pp > 1)"),
    "speculative_config": Flag(("--speculative-config",), Optional[str], "speculative decoding as vLLM's JSON, e.g. "
                               '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' or '
                               '\'{"model": DRAFT, "num_speculative_tokens": 3}\'; methods ngram, draft_model, '
                               'eagle, eagle3 (a head as "model"), mtp (the checkpoint\'s own layer)'),
    "structured_outputs_config": Flag(("--structured-outputs-config",), Optional[str], "structured outputs as "
                                      'vLLM\'s JSON: \'{"backend": "auto"}\' (xgrammar, llguidance for what it '
                                      'refuses), "xgrammar" or "guidance"; "disable_any_whitespace": true; "enable_in_reasoning": '
                                      'true (the grammar also during a reasoning model\'s thinking)'),
    "guided_decoding_backend": Flag(("--guided-decoding-backend",), Optional[str], "vLLM's older flag for the "
                                    "structured-output backend: auto, xgrammar or guidance"),
    "scheduling_policy": Flag(("--scheduling-policy",), str, "fcfs (first come, first served) or priority (a "
                              "request's priority field: lower first, then arrival; preemption takes the least urgent)"),
    "reasoning_parser": Flag(("--reasoning-parser",), Optional[str], "a reasoning model's thinking goes to "
                             "reasoning_content: deepseek_r1, qwen3, mistral, seed_oss, step3, ernie45, minimax_m2, "
                             "granite, glm45, deepseek_v3, olmo3 or hunyuan_a13b (structured outputs constrain the "
                             "answer)"),
    "kv_offloading_size": Flag(("--kv-offloading-size",), Optional[float], "GiB of CPU memory for KV blocks the "
                               "cache evicts: a later prompt with that prefix loads them back instead of computing "
                               "them (vLLM's native offloading; all ranks together)"),
    "kv_offloading_backend": Flag(("--kv-offloading-backend",), str, "native (llmctl's CPU tier)"),
    "otlp_traces_endpoint": Flag(("--otlp-traces-endpoint",), Optional[str], "an OpenTelemetry collector: one span "
                                 "per finished generation request (vLLM's llm_request and gen_ai.* attributes, the "
                                 "trace of an incoming traceparent), over gRPC or, with "
                                 "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf, HTTP (pip install "
                                 "'llmctl[otel]')"),
    "collect_detailed_traces": Flag(("--collect-detailed-traces",), Optional[str], "with --otlp-traces-endpoint: "
                                    "model (each request's forward-pass time; a GPU is synchronized after each "
                                    "step), worker (its steps from submission to sampled tokens) or all, "
                                    "comma-separated"),
    "enable_lora": Flag(("--enable-lora",), bool, "serve PEFT LoRA adapters on the base model, chosen per request by "
                                                  "its 'model' field"),
    "max_loras": Flag(("--max-loras",), int, "adapters resident (and running) at once; more are swapped in from "
                                             "host memory"),
    "max_lora_rank": Flag(("--max-lora-rank",), int, "the largest adapter rank accepted"),
    "limit_mm_per_prompt": Flag(("--limit-mm-per-prompt",), Optional[str], "vision-language models: most images "
                                "per prompt as vLLM's JSON, e.g. '{\"image\": 2}'; '{\"image\": 0}' serves the "
                                "model text-only"),
    "mm_processor_kwargs": Flag(("--mm-processor-kwargs",), Optional[str], "vision-language models: settings for "
                                "the model's processor as JSON, e.g. '{\"max_pixels\": 401408}'"),
    "allowed_local_media_path": Flag(("--allowed-local-media-path",), Optional[str], "file:// image URLs are "
                                     "read only below this folder (refused without it)"),
    "allowed_media_domains": Flag(("--allowed-media-domains",), Optional[list[str]], "http(s) image URLs only from "
                                  "these hosts (repeat the flag; default: any host)"),
    "trust_remote_code": Flag(("--trust-remote-code",), bool, "allow a model whose repository ships Python code "
                              "(auto_map): transformers may run its config and tokenizer code; its model code is "
                              "never run (llmctl serves such a model only with its own implementation)"),
    "tokenizer": Flag(("--tokenizer",), Optional[str], "a hub id or folder whose tokenizer (and chat template) "
                      "to use instead of the model's"),
    "load_format": Flag(("--load-format",), str, "auto (safetensors, or the GGUF given), safetensors, pt (the "
                        "pickled .bin files, read with torch.load weights_only), gguf, or dummy (random weights, "
                        "nothing downloaded but config and tokenizer: for planning and benchmarks)"),
    "quantization": Flag(("--quantization", "-q"), Optional[str], "the checkpoint's quantization method (awq, gptq, "
                         "fp8, compressed-tensors, gguf; vLLM's awq_marlin/gptq_marlin accepted): checked against "
                         "the checkpoint; llmctl quantizes no model while loading (see llmctl quantize)"),
    "generation_config": Flag(("--generation-config",), str, "sampling defaults: auto (the model's "
                              "generation_config.json), vllm (none), or a folder holding a generation_config.json"),
    "max_logprobs": Flag(("--max-logprobs",), int, "the most logprobs / prompt_logprobs a request may ask for"),
    "model_impl": Flag(("--model-impl",), str, "auto (llmctl's own implementation, else transformers' modules "
                                               "around llmctl's paged attention), llmctl (or vLLM's 'vllm') or "
                                               "transformers"),
    "runner": Flag(("--runner",), str, "auto (pooling for embedding, classifier and reward checkpoints, else "
                   "generate), generate or pooling"),
    "convert": Flag(("--convert",), str, "a pooling model's task: auto (from its architecture and "
                    "sentence-transformers files), embed, classify or reward"),
    "hf_overrides": Flag(("--hf-overrides",), Optional[str], "config.json fields replaced at load, as vLLM's JSON: "
                         "e.g. a Qwen3-Reranker as a classifier of its yes/no logits: '{\"architectures\": "
                         "[\"Qwen3ForSequenceClassification\"], \"classifier_from_token\": [\"no\", \"yes\"], "
                         "\"is_original_qwen3_reranker\": true}'"),
    "pooler_config": Flag(("--pooler-config", "--override-pooler-config"), Optional[str], "a pooling model's pooling, as vLLM's JSON: "
                          "pooling_type (LAST, MEAN, CLS; ALL or STEP for reward models), use_activation, "
                          "step_tag_id and returned_token_ids (STEP), e.g. '{\"pooling_type\": \"STEP\", "
                          "\"step_tag_id\": 12902}'"),
    "allow_pickle_weights": Flag(("--allow-pickle-weights",), bool, "load pytorch_model*.bin when a model has no "
                                 "safetensors (torch.load weights_only); off: safetensors only"),
}


@dataclass(frozen=True)
class EngineFlags:
    """The engine flags of one command line."""

    values: dict[str, Any]

    def config(self, **fields: Any) -> EngineConfig:
        """The EngineConfig these flags (and `fields`, e.g. model) describe; not yet validated."""
        return EngineConfig(**ENGINE_GROUP.parsed(self.values), **fields)


ENGINE_GROUP = FlagGroup("engine_flags", ENGINE_FLAGS, EngineConfig, EngineFlags)


def with_engine_flags(exclude: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Add the engine flags (but `exclude`) to a command with an `engine_flags: EngineFlags` parameter."""
    return with_flags(ENGINE_GROUP, exclude)
