"""The llmctl command line: thin commands over the shared core in llmctl.checkpoint."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from llmctl.errors import LlmctlError

if TYPE_CHECKING:
    from llmctl.bench.datasets import DatasetOptions

app = typer.Typer(
    name="llmctl",
    help="From a Hugging Face checkpoint to a measured service: inspect, license, ...",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ModelArg = Annotated[
    Optional[str],
    typer.Argument(help="hub id (org/name), local model directory, .gguf file; omitted: the default model "
                        "(SmolLM2-135M-Instruct)", show_default=False),
]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="hub branch, tag or commit")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]


def _print_version(value: bool) -> None:
    if value:
        from llmctl import __version__

        print(f"llmctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """From a Hugging Face checkpoint to a measured service."""


@app.command()
def inspect(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    text: Annotated[Optional[str], typer.Option("--text", help="show the token ids and pieces of this text")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code",
                                                    help="allow running the model's own Python code")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Architecture, parameters, KV cache size, tokenizer, chat template, license and backend of a model
    (of a PEFT LoRA adapter: its base model, rank, alpha, targets, parameters, and whether it fits)."""
    from llmctl.display import print_json, render_inspect
    from llmctl.inspect_report import build_inspect_report
    from llmctl.checkpoint.source import resolve_model

    source = resolve_model(model, revision, show_progress=not as_json)
    if source.file("adapter_config.json") and not source.file("config.json"):  # a LoRA adapter, not a model
        from llmctl.display import render_adapter
        from llmctl.engine.lora.adapter import describe_adapter

        adapter = describe_adapter(source.path)
        print_json(adapter) if as_json else render_adapter(source.name, adapter)
        return
    report = build_inspect_report(source, text=text, trust_remote_code=trust_remote_code)
    if as_json:
        print_json(report)
    else:
        render_inspect(report)


@app.command("license")
def license_(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    require: Annotated[Optional[list[str]], typer.Option(
        "--require", help="exit 1 unless the license allows it: commercial, derivatives, output-training "
                          "(repeatable)")] = None,
    write: Annotated[Optional[Path], typer.Option("--write", help="write LICENSE and NOTICE for a derived "
                                                                   "artifact into this directory")] = None,
    modification: Annotated[Optional[str], typer.Option(
        "--modification", help="what the derived artifact changed, for NOTICE (e.g. 'quantized to 4-bit GPTQ')")] = None,
    as_json: JsonOpt = False,
) -> None:
    """What the model's license permits, with the clause for each answer."""
    from llmctl.display import console, print_json, render_license
    from llmctl.checkpoint.license import check_requirements, detect_license, write_license_files
    from llmctl.checkpoint.source import resolve_model

    source = resolve_model(model, revision, show_progress=not as_json)
    report = detect_license(source)
    failures = check_requirements(report, require or [])
    written = write_license_files(report, write, source, modification=modification) if write else []
    if as_json:
        print_json({"report": report, "requirements": require or [], "unmet": failures,
                    "written": [str(p) for p in written]})
    else:
        render_license(report)
        for path in written:
            console.print(f"wrote {path}")
        for failure in failures:
            console.print(f"[red]requirement not met: {failure}[/red]")
    if failures:
        raise typer.Exit(1)


@app.command()
def plan(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="GPUs in total (default: the GPUs of this machine, "
                                                              "else nodes × gpus-per-node, else 1)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type, e.g. h100-80gb, a100-40gb, l4, mi300x "
                                                            "(default: this machine's, else h100-80gb)")] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="machines the GPUs are spread over")] = 1,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs in each node")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization",
                                                          help="fraction of each GPU's memory to use")] = 0.9,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, bfloat16, float16, float32")] = "auto",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto or fp8")] = "auto",
    quantization: Annotated[Optional[str], typer.Option("--quantization", "-q",
                                                        help="awq, gptq, fp8 or int8 weights")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len",
                                                         help="context per sequence (default: the model's)")] = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="sequences per step")] = 256,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens",
                                                        help="tokens per step (sizes activations)")] = 8192,
    tp: Annotated[Optional[int], typer.Option("--tensor-parallel-size", "--tp", help="evaluate only this TP")] = None,
    pp: Annotated[Optional[int], typer.Option("--pipeline-parallel-size", "--pp", help="evaluate only this PP")] = None,
    expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel",
                                                  help="MoE: whole experts per GPU instead of slices")] = False,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help="no CUDA graphs (saves their memory)")] = False,
    max_loras: Annotated[int, typer.Option(
        "--max-loras", help="count the memory of this many resident LoRA adapter slots (0: none)")] = 0,
    max_lora_rank: Annotated[int, typer.Option("--max-lora-rank", help="the rank of those slots")] = 16,
    min_concurrency: Annotated[float, typer.Option(
        "--min-concurrency", help="full-length sequences a replica must hold to be recommended")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Does it fit, on how many GPUs, with which TP/PP, and how many sequences will the KV cache hold?"""
    from llmctl.display import print_json, plan_to_dict, render_plan
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID, resolve_model
    from llmctl.plan.hardware import resolve_hardware
    from llmctl.plan.planner import PlanRequest, build_plan

    hardware = resolve_hardware(gpu, gpus, nodes, gpus_per_node)
    source = resolve_model(model, revision, show_progress=not as_json)
    request = PlanRequest(
        gpu=hardware.gpu, gpus=hardware.gpus, nodes=nodes, gpu_memory_utilization=gpu_memory_utilization,
        dtype=dtype, kv_cache_dtype=kv_cache_dtype, quantization=quantization, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, tp=tp, pp=pp,
        expert_parallel=expert_parallel, enforce_eager=enforce_eager, min_concurrency=min_concurrency,
        max_loras=max_loras, max_lora_rank=max_lora_rank,
    )
    result = build_plan(load_spec(source), request, model or DEFAULT_MODEL_ID)
    if as_json:
        print_json({**plan_to_dict(result), "gpu_note": hardware.note})
    else:
        render_plan(result, hardware.note)
    if result.recommended is None:
        raise typer.Exit(1)


def _parse_bytes(value: str | None, flag: str) -> int | None:
    """'4GiB', '512MiB', '2e9' or plain bytes."""
    if value is None:
        return None
    units = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "b": 1}
    text = value.strip().lower()
    for unit, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    try:
        return int(float(text))
    except ValueError:
        raise LlmctlError(f"{flag} {value!r} is not a size: use bytes or a unit, e.g. 4GiB") from None


TPOpt = Annotated[int, typer.Option("--tensor-parallel-size", "--tp", help="ranks each layer is split over")]
PPOpt = Annotated[int, typer.Option("--pipeline-parallel-size", "--pp", help="stages the layers are split into")]
DPOpt = Annotated[int, typer.Option("--data-parallel-size", "--dp", help="engine replicas behind one server")]
CPUThreadsOpt = Annotated[Optional[int], typer.Option(
    "--cpu-threads", help="torch threads per rank (default: the CPU cores shared evenly)")]
KVCacheDtypeOpt = Annotated[str, typer.Option(
    "--kv-cache-dtype", help="auto (the model's dtype) or fp8 (e4m3, scale 1.0: half of bfloat16's KV bytes)")]
EnforceEagerOpt = Annotated[bool, typer.Option(
    "--enforce-eager", help="no CUDA graphs for decode steps (captured on CUDA with the triton backend at TP 1, PP 1)")]
SpeculativeConfigOpt = Annotated[Optional[str], typer.Option(
    "--speculative-config", help='speculative decoding as vLLM\'s JSON, e.g. \'{"method": "ngram", '
    '"num_speculative_tokens": 4, "prompt_lookup_max": 4}\' or \'{"model": DRAFT, "num_speculative_tokens": 3}\'')]
EnableLoRAOpt = Annotated[bool, typer.Option(
    "--enable-lora", help="serve PEFT LoRA adapters on the base model, chosen per request by its 'model' field")]
MaxLoRAsOpt = Annotated[int, typer.Option(
    "--max-loras", help="adapters resident (and running) at once; more are swapped in from host memory")]
MaxLoRARankOpt = Annotated[int, typer.Option("--max-lora-rank", help="the largest adapter rank accepted")]
AttentionBackendOpt = Annotated[str, typer.Option(
    "--attention-backend", help="auto (triton on CUDA; on CPUs llmctl's C++ kernel, cpu), cpu, torch or triton")]


@app.command()
def serve(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    host: Annotated[str, typer.Option("--host", help="address to listen on (0.0.0.0: all interfaces)")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="port to listen on")] = 8000,
    served_model_name: Annotated[Optional[list[str]], typer.Option(
        "--served-model-name", help="name(s) clients use in 'model' (default: the model argument)")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LLMCTL_API_KEY",
                                                   help="require 'Authorization: Bearer KEY' on /v1")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", help="context per sequence")] = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="sequences per step")] = 256,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option("--max-num-batched-tokens",
                                                                  help="tokens per step")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16, float16")] = "auto",
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    kv_cache_memory: Annotated[Optional[str], typer.Option("--kv-cache-memory",
                                                           help="KV cache size, e.g. 4GiB (CPU default 2GiB)")] = None,
    chat_template: Annotated[Optional[str], typer.Option("--chat-template",
                                                         help="a Jinja file or a built-in name: chatml, bloom")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")] = True,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_queue_len: Annotated[Optional[int], typer.Option(
        "--max-queue-len",
        help="sequences (prompts × n) that may wait beyond max-num-seqs; more get 503 + Retry-After")] = None,
    tensor_parallel_size: TPOpt = 1,
    pipeline_parallel_size: PPOpt = 1,
    data_parallel_size: DPOpt = 1,
    cpu_threads: CPUThreadsOpt = None,
    attention_backend: AttentionBackendOpt = "auto",
    kv_cache_dtype: KVCacheDtypeOpt = "auto",
    enforce_eager: EnforceEagerOpt = False,
    speculative_config: SpeculativeConfigOpt = None,
    enable_lora: EnableLoRAOpt = False,
    lora_modules: Annotated[Optional[list[str]], typer.Option(
        "--lora-modules", help="adapters served by name: name=path (a folder or hub id) or vLLM's JSON "
                               "{\"name\": …, \"path\": …, \"base_model_name\": …}; several may follow one flag")] = None,
    max_loras: MaxLoRAsOpt = 1,
    max_lora_rank: MaxLoRARankOpt = 16,
    allow_runtime_lora_updating: Annotated[bool, typer.Option(
        "--allow-runtime-lora-updating", envvar="VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        help="enable /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING)")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code")] = False,
    allow_pickle_weights: Annotated[bool, typer.Option(
        "--allow-pickle-weights", help="load pytorch_model*.bin when a model has no safetensors "
                                       "(torch.load weights_only); off: safetensors only")] = False,
    max_request_bytes: Annotated[str, typer.Option(
        "--max-request-bytes", help="largest request body accepted (413 beyond), e.g. 16MiB")] = "16MiB",
    metrics_auth: Annotated[bool, typer.Option(
        "--metrics-auth", help="with --api-key, /metrics needs the key too")] = False,
    allowed_origins: Annotated[Optional[list[str]], typer.Option(
        "--allowed-origins", help="CORS: origins browsers may call the API from (none by default)")] = None,
    disable_log_requests: Annotated[bool, typer.Option(
        "--disable-log-requests", help="no access-log line per request")] = False,
    disable_log_stats: Annotated[bool, typer.Option(
        "--disable-log-stats", help="no periodic engine stats line")] = False,
) -> None:
    """An OpenAI-compatible server on llmctl's engine (completions, chat, streaming, metrics)."""
    from llmctl.engine.config import EngineConfig
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID
    from llmctl.server.app import ServerSettings
    from llmctl.server.serve import load_chat_template
    from llmctl.server.serve import serve as run_server

    from llmctl.engine.parallel.launch import run_torchrun_worker_if_not_driver

    config = EngineConfig(model=model, revision=revision, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, dtype=dtype,
                          gpu_memory_utilization=gpu_memory_utilization,
                          kv_cache_memory=_parse_bytes(kv_cache_memory, "--kv-cache-memory"),
                          enable_prefix_caching=enable_prefix_caching, seed=seed,
                          trust_remote_code=trust_remote_code, allow_pickle_weights=allow_pickle_weights,
                          show_progress=True, tensor_parallel_size=tensor_parallel_size,
                          pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size,
                          cpu_threads=cpu_threads, attention_backend=attention_backend,
                          kv_cache_dtype=kv_cache_dtype, enforce_eager=enforce_eager,
                          speculative_config=speculative_config, enable_lora=enable_lora, max_loras=max_loras,
                          max_lora_rank=max_lora_rank)
    config.validate()
    from llmctl.server.lora import parse_lora_modules

    adapters = parse_lora_modules(lora_modules or [])
    if (adapters or allow_runtime_lora_updating) and not enable_lora:
        raise LlmctlError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    if run_torchrun_worker_if_not_driver(config):  # torchrun rank > 0: a worker, no HTTP server
        return
    if max_queue_len is not None and max_queue_len < 0:
        raise LlmctlError(f"--max-queue-len must be 0 or more (got {max_queue_len})")
    settings = ServerSettings(
        config, served_model_name or [model or DEFAULT_MODEL_ID], api_key=api_key,
        chat_template=load_chat_template(chat_template), max_queue_len=max_queue_len,
        max_request_bytes=_parse_bytes(max_request_bytes, "--max-request-bytes"), metrics_auth=metrics_auth,
        allowed_origins=allowed_origins or [], log_requests=not disable_log_requests,
        stats_interval=None if disable_log_stats else 10.0, lora_modules=adapters,
        allow_runtime_lora_updating=allow_runtime_lora_updating)
    if metrics_auth and not api_key:
        raise LlmctlError("--metrics-auth protects /metrics with the API key: give --api-key too")
    raise typer.Exit(run_server(settings, host=host, port=port))


@app.command()
def quantize(
    model: ModelArg = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="folder for the quantized model (default: ./<model>-<AWQ|GPTQ>-<bits>bit)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace a quantized model already at the output")] = False,
    gptq: Annotated[bool, typer.Option(
        "--gptq", help="GPTQ (symmetric, stored desc_act false): vLLM's gptq/marlin")] = False,
    awq: Annotated[bool, typer.Option("--awq", help="AWQ (asymmetric, GEMM format)")] = False,
    revision: RevisionOpt = None,
    bits: Annotated[int, typer.Option("--bits", help="4 (GPTQ also 8)")] = 4,
    group_size: Annotated[Optional[int], typer.Option(
        "--group-size", help="inputs per scale; -1: per channel (default: 128, or the largest of 64 and 32 that "
                             "divides the model's sizes)")] = None,
    act_order: Annotated[bool, typer.Option(
        "--act-order/--no-act-order", help="GPTQ: most sensitive columns first, with static groups (the "
                                           "checkpoint stays desc_act false)")] = True,
    calib_file: Annotated[Optional[Path], typer.Option(
        "--calib-file", help="calibration text (.txt or .jsonl); default: pileval from the hub, or without hub "
                             "access the model's own samples (data-free)")] = None,
    calib_samples: Annotated[int, typer.Option("--calib-samples")] = 128,
    calib_seq_len: Annotated[int, typer.Option("--calib-seq-len")] = 512,
    eval_file: Annotated[Optional[Path], typer.Option(
        "--eval", help="held-out text: print perplexity of the original, round-to-nearest and the result")] = None,
    eval_tokens: Annotated[int, typer.Option("--eval-tokens", help="tokens of --eval text to score")] = 4096,
    no_redistribute: Annotated[bool, typer.Option(
        "--no-redistribute", help="local use only: quantize even when the license forbids sharing derivatives")] = False,
    as_json: JsonOpt = False,
) -> None:
    """4-bit GPTQ or AWQ checkpoints that vLLM, transformers and llmctl load unchanged."""
    from llmctl.display import print_json, render_quantize
    from llmctl.logs import configure_logging
    from llmctl.quant.command import QuantizeOptions, run_quantize

    configure_logging()  # the calibration source and the engine's lines when it samples calibration text
    if gptq == awq:
        raise LlmctlError("choose exactly one of --gptq and --awq")
    summary = run_quantize(QuantizeOptions(
        model=model, method="gptq" if gptq else "awq", output=output, revision=revision, bits=bits,
        group_size=group_size, act_order=act_order, calib_file=calib_file, calib_samples=calib_samples,
        calib_seq_len=calib_seq_len, eval_file=eval_file, eval_tokens=eval_tokens, redistribute=not no_redistribute,
        show_progress=not as_json, force=force))
    if as_json:
        print_json(summary)
    else:
        render_quantize(summary)


bench_app = typer.Typer(help="Latency and throughput benchmarks: any OpenAI-compatible server, or the engine "
                             "in-process.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

DatasetNameOpt = Annotated[str, typer.Option("--dataset-name", help="random, sharegpt, shared-prefix or custom (JSONL)")]
DatasetPathOpt = Annotated[Optional[Path], typer.Option("--dataset-path", help="ShareGPT JSON or custom JSONL file")]
NumPromptsOpt = Annotated[int, typer.Option("--num-prompts", help="requests in the workload")]
InputLenOpt = Annotated[int, typer.Option("--random-input-len", help="random: prompt tokens")]
OutputLenOpt = Annotated[int, typer.Option("--random-output-len", help="random: output tokens")]
RangeRatioOpt = Annotated[float, typer.Option("--random-range-ratio",
                                              help="random: lengths uniform in len·[1−r, 1+r]")]
ShareGPTLenOpt = Annotated[Optional[int], typer.Option("--sharegpt-output-len",
                                                       help="sharegpt: output tokens (default: the reply's)")]
GroupsOpt = Annotated[int, typer.Option("--shared-prefix-groups", help="shared-prefix: distinct system prompts")]
PrefixLenOpt = Annotated[int, typer.Option("--shared-prefix-len", help="shared-prefix: system prompt tokens")]
QuestionLenOpt = Annotated[int, typer.Option("--shared-prefix-question-len", help="shared-prefix: question tokens")]
PrefixOutputOpt = Annotated[int, typer.Option("--shared-prefix-output-len", help="shared-prefix: output tokens")]
CustomLenOpt = Annotated[int, typer.Option("--custom-output-len", help="custom: output tokens when a line has none")]
SeedOpt = Annotated[int, typer.Option("--seed", help="makes datasets and arrival times reproducible")]
PercentilesOpt = Annotated[str, typer.Option("--metric-percentiles", help="comma-separated percentiles to report")]


def _dataset_options(flags: dict[str, Any]) -> DatasetOptions:
    """The workload flags of a bench command (its parameters, by name) as DatasetOptions."""
    import dataclasses

    from llmctl.bench.datasets import DatasetOptions

    names = {f.name for f in dataclasses.fields(DatasetOptions)}
    return DatasetOptions(name=flags["dataset_name"], path=flags["dataset_path"],
                          **{k: v for k, v in flags.items() if k in names and k not in ("name", "path")})


def _percentiles(text: str) -> tuple[float, ...]:
    from llmctl.bench.serve_bench import parse_list

    values = tuple(parse_list(text, "--metric-percentiles", float))
    if any(not 0 < p < 100 for p in values):
        raise LlmctlError("--metric-percentiles must be between 0 and 100")
    return values


@bench_app.command("serve")
def bench_serve(
    base_url: Annotated[str, typer.Option("--base-url", help="the server, without /v1")] = "http://127.0.0.1:8000",
    model: Annotated[Optional[str], typer.Option("--model", help="default: the server's first model")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="default: the model's")] = None,
    endpoint: Annotated[str, typer.Option("--endpoint", help="completions or chat")] = "completions",
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="OPENAI_API_KEY")] = None,
    dataset_name: DatasetNameOpt = "random",
    dataset_path: DatasetPathOpt = None,
    num_prompts: NumPromptsOpt = 1000,
    random_input_len: InputLenOpt = 1024,
    random_output_len: OutputLenOpt = 128,
    random_range_ratio: RangeRatioOpt = 0.0,
    sharegpt_output_len: ShareGPTLenOpt = None,
    shared_prefix_groups: GroupsOpt = 4,
    shared_prefix_len: PrefixLenOpt = 512,
    shared_prefix_question_len: QuestionLenOpt = 32,
    shared_prefix_output_len: PrefixOutputOpt = 128,
    custom_output_len: CustomLenOpt = 256,
    request_rate: Annotated[str, typer.Option(
        "--request-rate", help="requests/s (Poisson), inf = all at once; a list sweeps: 1,2,4,inf")] = "inf",
    burstiness: Annotated[float, typer.Option(
        "--burstiness", help="gamma shape of arrival gaps: 1 Poisson, <1 burstier, >1 steadier")] = 1.0,
    max_concurrency: Annotated[Optional[str], typer.Option(
        "--max-concurrency", help="requests in flight at most; a list sweeps: 1,4,16,64")] = None,
    num_warmups: Annotated[int, typer.Option("--num-warmups", help="unmeasured requests sent first")] = 0,
    goodput: Annotated[Optional[list[str]], typer.Option(
        "--goodput", help="SLOs in ms, e.g. --goodput ttft:500 --goodput tpot:50 (also e2el)")] = None,
    metric_percentiles: PercentilesOpt = "90,99",
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="generate exactly the requested tokens")] = False,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="default: the server's")] = None,
    save_result: Annotated[bool, typer.Option("--save-result", help="write the results as JSON")] = False,
    result_filename: Annotated[Optional[Path], typer.Option(
        "--result-filename", help="JSON file for --save-result (implies it)")] = None,
    result_dir: Annotated[Path, typer.Option("--result-dir", help="folder for a generated result name")] = Path("."),
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write PNG charts into this folder")] = None,
    ready_check_timeout_sec: Annotated[float, typer.Option(
        "--ready-check-timeout-sec", help="wait this long for a starting server")] = 600,
    seed: SeedOpt = 0,
) -> None:
    """Benchmark an OpenAI-compatible server, with `vllm bench serve`'s flags and metric definitions."""
    from rich.console import Console

    from llmctl.bench.metrics import parse_goodput
    from llmctl.bench.report import bench_progress, render_run, run_to_json, save_json, write_plots
    from llmctl.bench.serve_bench import (ServeBenchOptions, parse_concurrency, parse_list, parse_rate,
                                          run_serve_bench)

    percentiles = _percentiles(metric_percentiles)
    dataset = _dataset_options(locals())
    if burstiness <= 0:
        raise LlmctlError("--burstiness must be positive")
    options = ServeBenchOptions(
        base_url=base_url, model=model, tokenizer=tokenizer, endpoint=endpoint, api_key=api_key, dataset=dataset,
        request_rates=parse_list(request_rate, "--request-rate", parse_rate), burstiness=burstiness,
        max_concurrencies=parse_list(max_concurrency or "none", "--max-concurrency", parse_concurrency),
        num_warmups=num_warmups, goodput=parse_goodput(goodput or []), percentiles=percentiles,
        ignore_eos=ignore_eos, temperature=temperature, ready_check_timeout_s=ready_check_timeout_sec)
    console = Console()
    with bench_progress(console) as on_point:
        run = run_serve_bench(options, on_point, lambda text: console.print(f"[yellow]warning:[/] {text}"))
    render_run(console, run, percentiles)
    if save_result or result_filename:
        path = result_filename or result_dir / _result_name(run.model, options.request_rates)
        save_json(run_to_json(run, percentiles), path)
        console.print(f"results: {path}")
    if plot:
        for path in write_plots(run, plot, percentiles):
            console.print(f"chart: {path}")


def _result_name(model: str, rates: list[float]) -> str:
    from datetime import datetime

    rate = "-".join("inf" if r == float("inf") else f"{r:g}" for r in rates)
    return f"openai-{rate}qps-{model.split('/')[-1]}-{datetime.now():%Y%m%d-%H%M%S}.json"


@bench_app.command("offline")
def bench_offline(
    model: ModelArg = None,
    dataset_name: DatasetNameOpt = "random",
    dataset_path: DatasetPathOpt = None,
    num_prompts: NumPromptsOpt = 64,
    random_input_len: InputLenOpt = 128,
    random_output_len: OutputLenOpt = 128,
    random_range_ratio: RangeRatioOpt = 0.0,
    sharegpt_output_len: ShareGPTLenOpt = None,
    shared_prefix_groups: GroupsOpt = 4,
    shared_prefix_len: PrefixLenOpt = 512,
    shared_prefix_question_len: QuestionLenOpt = 32,
    shared_prefix_output_len: PrefixOutputOpt = 128,
    custom_output_len: CustomLenOpt = 256,
    temperature: Annotated[float, typer.Option("--temperature")] = 1.0,
    tensor_parallel_size: TPOpt = 1,
    pipeline_parallel_size: PPOpt = 1,
    data_parallel_size: DPOpt = 1,
    cpu_threads: CPUThreadsOpt = None,
    attention_backend: AttentionBackendOpt = "auto",
    kv_cache_dtype: KVCacheDtypeOpt = "auto",
    enforce_eager: EnforceEagerOpt = False,
    speculative_config: SpeculativeConfigOpt = None,
    enable_lora: EnableLoRAOpt = False,
    lora_path: Annotated[Optional[str], typer.Option(
        "--lora-path", help="with --enable-lora: an adapter (folder or hub id) each request runs as one of "
                            "--max-loras adapters, as vLLM's benchmark_throughput")] = None,
    max_loras: MaxLoRAsOpt = 1,
    max_lora_rank: MaxLoRARankOpt = 16,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs")] = 256,
    max_num_batched_tokens: Annotated[Optional[int], typer.Option("--max-num-batched-tokens")] = None,
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len")] = None,
    compare: Annotated[Optional[str], typer.Option(
        "--compare", help="also run the workload through transformers generate: transformers")] = None,
    hf_batch_size: Annotated[int, typer.Option("--hf-batch-size", help="--compare: sequences per padded batch")] = 16,
    metric_percentiles: PercentilesOpt = "90,99",
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """The same workloads through the engine in-process: tokens/s, requests/s, TTFT/TPOT; --compare transformers."""
    from rich.console import Console

    from llmctl.bench.offline import OfflineOptions, run_offline
    from llmctl.bench.report import offline_to_dict, render_offline
    from llmctl.display import print_json

    dataset = _dataset_options(locals())
    if hf_batch_size < 1:
        raise LlmctlError("--hf-batch-size must be at least 1")
    result = run_offline(OfflineOptions(
        model=model, dataset=dataset, temperature=temperature, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len, compare=compare,
        hf_batch_size=hf_batch_size, percentiles=_percentiles(metric_percentiles),
        parallel={"tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size,
                  "data_parallel_size": data_parallel_size, "cpu_threads": cpu_threads,
                  "attention_backend": attention_backend, "kv_cache_dtype": kv_cache_dtype,
                  "enforce_eager": enforce_eager, "speculative_config": speculative_config,
                  "enable_lora": enable_lora, "max_loras": max_loras, "max_lora_rank": max_lora_rank},
        lora_path=lora_path))
    if as_json:
        print_json(offline_to_dict(result))
    else:
        render_offline(Console(), result)


def spread_multi_values(args: list[str]) -> list[str]:
    """vLLM's `--lora-modules a=PATH b=PATH` (argparse nargs='+') as click's repeated option."""
    out, after_value = [], False  # after_value: the previous argument was a --lora-modules value
    for index, arg in enumerate(args):
        extra = after_value and not arg.startswith("-") and ("=" in arg or arg.startswith("{"))
        if extra:
            out.append("--lora-modules")
        out.append(arg)
        after_value = extra or (index > 0 and args[index - 1] == "--lora-modules")
    return out


def main() -> None:
    """Entry point: user errors print one line and exit 2; nothing prints a traceback."""
    try:
        # returns the exit code of typer.Exit in this mode
        result = app(args=spread_multi_values(sys.argv[1:]), standalone_mode=False)
    except LlmctlError as exc:
        _fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # click usage errors and anything unexpected
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `llmctl`: the help was printed
            sys.exit(0)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):  # click's usage errors
            exc.show()
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            _fail("aborted", 1)
        if os.environ.get("LLMCTL_DEBUG"):
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set LLMCTL_DEBUG=1 for a traceback and "
              "please report it)", 3)
    sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, code: int) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
