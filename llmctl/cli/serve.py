"""`llmctl serve`: the OpenAI-compatible server on llmctl's engine."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from llmctl.cli.common import ModelArg, RevisionOpt, parse_bytes
from llmctl.cli.engine_flags import EngineFlags, with_engine_flags
from llmctl.cli.listener_flags import with_listener_flags
from llmctl.errors import LlmctlError
from llmctl.server.listener import Listener

AutoToolChoiceOpt = Annotated[bool, typer.Option(
    "--enable-auto-tool-choice/--no-enable-auto-tool-choice",
    help="tool_choice \"auto\": find tool calls in the model's text with --tool-call-parser")]
ToolCallParserOpt = Annotated[Optional[str], typer.Option(
    "--tool-call-parser", help="how the model writes tool calls: hermes (Qwen2.5/Qwen3, Hermes), llama3_json, mistral, "
                               "pythonic (llama4_pythonic), llama4_json, qwen3_coder (qwen3_xml), seed_oss, glm45 (glm4_moe), kimi_k2, deepseek_v31, "
                               "deepseek_v3, jamba, internlm, granite, granite-20b-fc, phi4_mini_json, xlam, minimax_m2, "
                               "hunyuan_a13b, or one a --tool-parser-plugin registers")]
ToolParserPluginOpt = Annotated[Optional[str], typer.Option(
    "--tool-parser-plugin", help="a Python file whose @ToolParserManager.register_module(\"name\") classes become "
                                 "--tool-call-parser names")]
LoRAModulesOpt = Annotated[Optional[list[str]], typer.Option(
    "--lora-modules", help="adapters served by name: name=path (a folder or hub id) or vLLM's JSON "
                           "{\"name\": …, \"path\": …, \"base_model_name\": …}; several may follow one flag")]

MaxQueueLenOpt = Annotated[Optional[int], typer.Option(
    "--max-queue-len",
    help="sequences (prompts × n) that may wait beyond max-num-seqs; more get 503 + Retry-After")]
RuntimeLoRAOpt = Annotated[bool, typer.Option(
    "--allow-runtime-lora-updating/--no-allow-runtime-lora-updating", envvar="VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    help="enable /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING)")]
MaxRequestBytesOpt = Annotated[str, typer.Option(
    "--max-request-bytes", help="largest request body accepted (413 beyond), e.g. 16MiB")]
MetricsAuthOpt = Annotated[bool, typer.Option(
    "--metrics-auth/--no-metrics-auth", help="with --api-key, /metrics needs the key too")]
AllowedOriginsOpt = Annotated[Optional[list[str]], typer.Option(
    "--allowed-origins", help="CORS: origins browsers may call the API from, as vLLM's JSON list "
                              "'[\"https://a.example\"]' or repeated (none by default, where vLLM allows all)")]
NoAccessLogOpt = Annotated[bool, typer.Option(
    "--disable-uvicorn-access-log/--no-disable-uvicorn-access-log", help="no access-log line per request")]
LogRequestsOpt = Annotated[bool, typer.Option(
    "--enable-log-requests/--no-enable-log-requests", help="log each generation request as it arrives: its id, "
                                                          "prompt (its first --max-log-len characters), token count "
                                                          "and sampling parameters")]
NoRequestLogOpt = Annotated[bool, typer.Option(
    "--disable-log-requests/--no-disable-log-requests", help="vLLM's older flag: requests are not logged (the "
                                                            "default; --enable-log-requests logs them)")]
MaxLogLenOpt = Annotated[Optional[int], typer.Option(
    "--max-log-len", help="--enable-log-requests: characters of each prompt logged (default: all)")]
MetricsPrefixOpt = Annotated[str, typer.Option(
    "--metrics-prefix", help="/metrics names: llmctl (llmctl:…) or vllm (vLLM's vllm:… names, which its Grafana "
                             "dashboard and autoscalers read)")]
ModelsOpt = Annotated[Optional[list[str]], typer.Option(
    "--models", help="serve several models, routed by each request's 'model': NAME=PATH (a folder, GGUF or hub id; "
                     "NAME= for the default model), then that model's own serve flags in the same quoted value, "
                     "e.g. --models 'chat=./Qwen3-0.6B --max-model-len 4096'; or a folder of model folders and "
                     "GGUF files; repeat for more. Each runs as a server process of its own, loaded on first use; "
                     "the other flags go to every model")]
MaxLoadedModelsOpt = Annotated[int, typer.Option(
    "--max-loaded-models", help="with --models: most models loaded at once; the least recently used idle one is "
                                "unloaded to make room")]
ModelSleepLevelOpt = Annotated[int, typer.Option(
    "--model-sleep-level", help="with --models: put the least recently used idle model to sleep at this level "
                                "(vLLM's sleep mode: 1 keeps its weights in CPU memory, 2 reads them again on waking) "
                                "instead of stopping its server; it wakes on its next request. 0: stop it")]
ModelLoadTimeoutOpt = Annotated[float, typer.Option(
    "--model-load-timeout", help="with --models: seconds a request waits for its model to load (503 after)")]
NoStatsLogOpt = Annotated[bool, typer.Option(
    "--disable-log-stats/--no-disable-log-stats", help="no periodic engine stats line")]


@with_engine_flags()
@with_listener_flags()
def serve(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    served_model_name: Annotated[Optional[list[str]], typer.Option(
        "--served-model-name", help="name(s) clients use in 'model' (default: the model argument); as vLLM's, the "
                                 "names run to the next option, so give MODEL before this flag")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar=["LLMCTL_API_KEY", "VLLM_API_KEY"],
                                                   help="require 'Authorization: Bearer KEY' on /v1")] = None,
    chat_template: Annotated[Optional[str], typer.Option("--chat-template",
                                                         help="a Jinja file or a built-in name: chatml, bloom")] = None,
    max_queue_len: MaxQueueLenOpt = None,
    lora_modules: LoRAModulesOpt = None,
    allow_runtime_lora_updating: RuntimeLoRAOpt = False,
    max_request_bytes: MaxRequestBytesOpt = "16MiB",
    metrics_auth: MetricsAuthOpt = False,
    metrics_prefix: MetricsPrefixOpt = "llmctl",
    allowed_origins: AllowedOriginsOpt = None,
    disable_log_requests: NoRequestLogOpt = False,
    enable_log_requests: LogRequestsOpt = False,
    max_log_len: MaxLogLenOpt = None,
    disable_uvicorn_access_log: NoAccessLogOpt = False,
    disable_log_stats: NoStatsLogOpt = False,
    enable_auto_tool_choice: AutoToolChoiceOpt = False,
    tool_call_parser: ToolCallParserOpt = None,
    tool_parser_plugin: ToolParserPluginOpt = None,
    models: ModelsOpt = None,
    max_loaded_models: MaxLoadedModelsOpt = 4,
    model_load_timeout: ModelLoadTimeoutOpt = 600.0,
    model_sleep_level: ModelSleepLevelOpt = 0,
    *,
    listener: Listener,
    engine_flags: EngineFlags,
) -> None:
    """An OpenAI-compatible server on llmctl's engine (completions, chat, streaming, metrics)."""
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID
    from llmctl.engine.executor.launch import run_torchrun_worker_if_not_driver
    from llmctl.server.serve import load_chat_template
    from llmctl.server.serve import serve as run_server
    from llmctl.server.state import ServerSettings

    listener.validate()
    config = engine_flags.config(model=model, revision=revision, show_progress=True)
    config.validate()
    if models:
        raise typer.Exit(_route(models, model, served_model_name, listener, max_loaded_models, model_load_timeout,
                                api_key, model_sleep_level))
    adapters = _lora_adapters(lora_modules or [], allow_runtime_lora_updating, config.enable_lora)
    if run_torchrun_worker_if_not_driver(config):  # torchrun rank > 0: a worker, no HTTP server
        return
    _check_server_flags(max_queue_len, metrics_auth, api_key, metrics_prefix)
    tool_parser = auto_tool_parser(enable_auto_tool_choice, tool_call_parser, tool_parser_plugin)
    logs = dict(access_log=not disable_uvicorn_access_log, log_requests=enable_log_requests and not disable_log_requests,
                max_log_len=max_log_len, stats_interval=None if disable_log_stats else 10.0)
    settings = ServerSettings(
        config, served_model_name or [model or DEFAULT_MODEL_ID], api_key=api_key,
        chat_template=load_chat_template(chat_template), max_queue_len=max_queue_len,
        max_request_bytes=parse_bytes(max_request_bytes, "--max-request-bytes"), metrics_auth=metrics_auth,
        allowed_origins=parse_origins(allowed_origins or []), **logs, lora_modules=adapters,
        allow_runtime_lora_updating=allow_runtime_lora_updating, tool_parser=tool_parser, metrics_prefix=metrics_prefix)
    raise typer.Exit(run_server(settings, listener))


def _route(models: list[str], model: str | None, served_model_name: list[str] | None, listener: Listener,
           max_loaded: int, load_timeout: float, api_key: str | None, sleep_level: int) -> int:
    from llmctl.server.router.run import serve_router

    if model or served_model_name:
        raise LlmctlError("--models names every model it serves: leave out the MODEL argument and "
                          "--served-model-name")
    return serve_router(models, listener, max_loaded, load_timeout, api_key, sleep_level)


def _lora_adapters(values: list[str], runtime_updates: bool, enable_lora: bool) -> list:
    from llmctl.server.lora import parse_lora_modules

    adapters = parse_lora_modules(values)
    if (adapters or runtime_updates) and not enable_lora:
        raise LlmctlError("--lora-modules and --allow-runtime-lora-updating need --enable-lora")
    return adapters


def _check_server_flags(max_queue_len: int | None, metrics_auth: bool, api_key: str | None, metrics_prefix: str) -> None:
    from llmctl.server.metrics import PREFIXES

    if metrics_prefix not in PREFIXES:
        raise LlmctlError(f"--metrics-prefix {metrics_prefix!r}: choose llmctl or vllm")
    if max_queue_len is not None and max_queue_len < 0:
        raise LlmctlError(f"--max-queue-len must be 0 or more (got {max_queue_len})")
    if metrics_auth and not api_key:
        raise LlmctlError("--metrics-auth protects /metrics with the API key: give --api-key too")


def auto_tool_parser(enable: bool, name: str | None, plugin: str | None):
    """The parser class for tool_choice "auto", as vLLM's flags choose it (None: "auto" is refused)."""
    from llmctl.server.tool_parsers import ToolParserManager

    if plugin is not None:
        ToolParserManager.import_tool_parser(plugin)
    if enable and name is None:
        raise LlmctlError("--enable-auto-tool-choice needs --tool-call-parser NAME (hermes, llama3_json, mistral, "
                          "pythonic, qwen3_coder, glm45, kimi_k2, deepseek_v31, …): how the model writes its tool calls")
    parser = ToolParserManager.get_tool_parser(name) if name is not None else None
    return parser if enable else None


def parse_origins(values: list[str]) -> list[str]:
    """--allowed-origins values: vLLM's JSON list, or plain origins (one per flag)."""
    import json

    origins: list[str] = []
    for value in values:
        if not value.lstrip().startswith("["):
            origins.append(value)
            continue
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise LlmctlError(f"--allowed-origins {value!r} is not a JSON list ({exc.msg}): give e.g. "
                              '\'["https://a.example"]\'') from None
        if not all(isinstance(origin, str) for origin in parsed):
            raise LlmctlError(f"--allowed-origins {value!r}: the list must hold origin strings")
        origins.extend(parsed)
    return origins
