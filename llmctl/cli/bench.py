"""`llmctl bench serve` (any OpenAI-compatible server) and `llmctl bench offline` (the engine
in-process): the workload flags are declared once for both, the engine flags once for all."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llmctl.bench.datasets import DatasetOptions
from llmctl.cli.bench_flags import REQUEST_GROUP, TARGET_GROUP, RequestFlags, Target, sampling_fields
from llmctl.cli.common import JsonOpt, ModelArg
from llmctl.cli.engine_flags import EngineFlags, with_engine_flags
from llmctl.cli.flags import Flag, FlagGroup, with_flags
from llmctl.errors import LlmctlError

if TYPE_CHECKING:
    from llmctl.bench.serve_bench import ServeBenchOptions

DATASET_FLAGS: dict[str, Flag] = {  # DatasetOptions field -> its flag
    "name": Flag(("--dataset-name",), str, "random, random-mm (with images; the chat endpoint), sharegpt, "
                                           "shared-prefix or custom (JSONL)"),
    "path": Flag(("--dataset-path",), Optional[Path], "ShareGPT JSON or custom JSONL file"),
    "num_prompts": Flag(("--num-prompts",), int, "requests in the workload"),
    "random_input_len": Flag(("--random-input-len",), int, "random: prompt tokens"),
    "random_output_len": Flag(("--random-output-len",), int, "random: output tokens"),
    "random_range_ratio": Flag(("--random-range-ratio",), float, "random: lengths uniform in len·[1−r, 1+r]"),
    "sharegpt_output_len": Flag(("--sharegpt-output-len",), Optional[int],
                                "sharegpt: output tokens (default: the reply's)"),
    "shared_prefix_groups": Flag(("--shared-prefix-groups",), int, "shared-prefix: distinct system prompts"),
    "shared_prefix_len": Flag(("--shared-prefix-len",), int, "shared-prefix: system prompt tokens"),
    "shared_prefix_question_len": Flag(("--shared-prefix-question-len",), int, "shared-prefix: question tokens"),
    "shared_prefix_output_len": Flag(("--shared-prefix-output-len",), int, "shared-prefix: output tokens"),
    "custom_output_len": Flag(("--custom-output-len",), int, "custom: output tokens when a line has none"),
    "random_mm_base_items_per_request": Flag(("--random-mm-base-items-per-request",), int,
                                             "random-mm: images per request"),
    "random_mm_num_mm_items_range_ratio": Flag(("--random-mm-num-mm-items-range-ratio",), float,
                                               "random-mm: image counts uniform in base·[1−r, 1+r]"),
    "random_mm_limit_mm_per_prompt": Flag(("--random-mm-limit-mm-per-prompt",), str,
                                          "random-mm: most images per request, as JSON"),
    "random_mm_bucket_config": Flag(("--random-mm-bucket-config",), str, "random-mm: image sizes and their "
                                    "probabilities, {(height, width, 1): p, ...}"),
    "seed": Flag(("--seed",), int, "makes datasets and arrival times reproducible"),
}
DATASET_GROUP = FlagGroup("dataset", DATASET_FLAGS, DatasetOptions, lambda values: DatasetOptions(**values))
PercentilesOpt = Annotated[str, typer.Option("--metric-percentiles", help="comma-separated percentiles to report")]

bench_app = typer.Typer(help="Latency and throughput benchmarks: any OpenAI-compatible server, or the engine "
                             "in-process.", no_args_is_help=True)


def _percentiles(text: str) -> tuple[float, ...]:
    from llmctl.bench.serve_bench import parse_list

    values = tuple(parse_list(text, "--metric-percentiles", float))
    if any(not 0 < p < 100 for p in values):
        raise LlmctlError("--metric-percentiles must be between 0 and 100")
    return values


@bench_app.command("serve")
@with_flags(DATASET_GROUP)
@with_flags(TARGET_GROUP)
@with_flags(REQUEST_GROUP)
def bench_serve(
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="OPENAI_API_KEY")] = None,
    request_rate: Annotated[str, typer.Option(
        "--request-rate", help="requests/s (Poisson), inf = all at once; a list sweeps: 1,2,4,inf")] = "inf",
    burstiness: Annotated[float, typer.Option(
        "--burstiness", help="gamma shape of arrival gaps: 1 Poisson, <1 burstier, >1 steadier")] = 1.0,
    max_concurrency: Annotated[Optional[str], typer.Option(
        "--max-concurrency", help="requests in flight at most; a list sweeps: 1,4,16,64")] = None,
    num_warmups: Annotated[int, typer.Option("--num-warmups", help="unmeasured requests sent first")] = 0,
    goodput: Annotated[Optional[list[str]], typer.Option(
        "--goodput", help="SLOs in ms, as vLLM: --goodput ttft:500 tpot:50 (also e2el)")] = None,
    metric_percentiles: PercentilesOpt = "90,99",
    percentile_metrics: Annotated[str, typer.Option(
        "--percentile-metrics", help="comma-separated latencies to report: ttft, tpot, itl, e2el (all by default; "
                                     "vLLM's default leaves out e2el)")] = "ttft,tpot,itl,e2el",
    save_result: Annotated[bool, typer.Option("--save-result", help="write the results as JSON")] = False,
    result_filename: Annotated[Optional[Path], typer.Option(
        "--result-filename", help="JSON file for --save-result (implies it)")] = None,
    result_dir: Annotated[Path, typer.Option("--result-dir", help="folder for a generated result name")] = Path("."),
    save_detailed: Annotated[bool, typer.Option(
        "--save-detailed", help="vLLM's flag for per-request fields in the JSON: llmctl always writes them")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write PNG charts into this folder")] = None,
    ready_check_timeout_sec: Annotated[float, typer.Option(
        "--ready-check-timeout-sec", help="wait this long for a starting server")] = 600,
    *,
    dataset: DatasetOptions,
    target: Target,
    request: RequestFlags,
) -> None:
    """Benchmark an OpenAI-compatible server, with `vllm bench serve`'s flags and metric definitions."""
    from rich.console import Console

    from llmctl.bench.report import bench_progress, render_run, run_to_json, save_json, write_plots
    from llmctl.bench.serve_bench import run_serve_bench

    options = _serve_options(target, request, dataset, api_key, request_rate, burstiness, max_concurrency,
                             num_warmups, goodput, metric_percentiles, percentile_metrics, ready_check_timeout_sec)
    console = Console()
    with bench_progress(console) as on_point:
        run = run_serve_bench(options, on_point, lambda text: console.print(f"[yellow]warning:[/] {text}"))
    render_run(console, run, options.percentiles)
    if save_result or result_filename:
        path = result_filename or result_dir / _result_name(run.model, options.request_rates)
        save_json(run_to_json(run, options.percentiles), path)
        console.print(f"results: {path}")
    if plot:
        for path in write_plots(run, plot, options.percentiles):
            console.print(f"chart: {path}")


def _serve_options(target: Target, request: RequestFlags, dataset: DatasetOptions, api_key: str | None,
                   request_rate: str, burstiness: float, max_concurrency: str | None, num_warmups: int,
                   goodput: list[str] | None, metric_percentiles: str, percentile_metrics: str,
                   ready_check_timeout_sec: float) -> ServeBenchOptions:
    from llmctl.bench.metrics import parse_goodput
    from llmctl.bench.serve_bench import ServeBenchOptions, parse_concurrency, parse_list, parse_rate

    if burstiness <= 0:
        raise LlmctlError("--burstiness must be positive")
    return ServeBenchOptions(
        base_url=target.base_url, model=target.model, tokenizer=target.tokenizer, endpoint=target.endpoint,
        api_key=api_key, dataset=dataset, sampling=sampling_fields(request),
        percentile_metrics=_latency_metrics(percentile_metrics),
        request_rates=parse_list(request_rate, "--request-rate", parse_rate), burstiness=burstiness,
        max_concurrencies=parse_list(max_concurrency or "none", "--max-concurrency", parse_concurrency),
        num_warmups=num_warmups, goodput=parse_goodput(goodput or []), percentiles=_percentiles(metric_percentiles),
        ignore_eos=request.ignore_eos, temperature=request.temperature, ready_check_timeout_s=ready_check_timeout_sec)


def _latency_metrics(text: str) -> tuple[str, ...]:
    from llmctl.bench.metrics import LATENCY_METRICS

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LATENCY_METRICS]
    if unknown or not names:
        raise LlmctlError(f"--percentile-metrics {text!r}: use a comma-separated subset of {','.join(LATENCY_METRICS)}")
    return names


def _json_schema(given: str | None) -> dict | None:
    """--json-schema: a file holding the schema, or the schema itself."""
    import json
    from pathlib import Path

    if given is None:
        return None
    text = Path(given).read_text() if not given.lstrip().startswith("{") and Path(given).is_file() else given
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LlmctlError(f"--json-schema: neither a file nor valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise LlmctlError("--json-schema must be a JSON object (a schema)")
    return schema


def _result_name(model: str, rates: list[float]) -> str:
    from datetime import datetime

    rate = "-".join("inf" if r == float("inf") else f"{r:g}" for r in rates)
    return f"openai-{rate}qps-{model.split('/')[-1]}-{datetime.now():%Y%m%d-%H%M%S}.json"


@bench_app.command("offline")
@with_flags(DATASET_GROUP, num_prompts=64, random_input_len=128)
@with_engine_flags(exclude=("seed", "otlp_traces_endpoint", "collect_detailed_traces"))  # --seed: the workload's, as in bench serve; no spans
def bench_offline(
    model: ModelArg = None,
    temperature: Annotated[float, typer.Option("--temperature")] = 1.0,
    lora_path: Annotated[Optional[str], typer.Option(
        "--lora-path", help="with --enable-lora: an adapter (folder or hub id) each request runs as one of "
                            "--max-loras adapters, as vLLM's benchmark_throughput")] = None,
    compare: Annotated[Optional[str], typer.Option(
        "--compare", help="also run the workload through transformers generate: transformers")] = None,
    hf_batch_size: Annotated[int, typer.Option("--hf-batch-size", help="--compare: sequences per padded batch")] = 16,
    json_schema: Annotated[Optional[str], typer.Option(
        "--json-schema", help="a JSON schema (file or inline JSON) every output follows: the cost of structured "
                              "outputs (with ignore_eos, a finished schema leaves the rest unconstrained)")] = None,
    metric_percentiles: PercentilesOpt = "90,99",
    as_json: JsonOpt = False,
    *,
    dataset: DatasetOptions,
    engine_flags: EngineFlags,
) -> None:
    """The same workloads through the engine in-process: tokens/s, requests/s, TTFT/TPOT; --compare transformers."""
    from rich.console import Console

    from llmctl.bench.offline import OfflineOptions, run_offline
    from llmctl.bench.report import offline_to_dict, render_offline
    from llmctl.display import print_json

    if hf_batch_size < 1:
        raise LlmctlError("--hf-batch-size must be at least 1")
    result = run_offline(OfflineOptions(
        engine=engine_flags.config(model=model), dataset=dataset, temperature=temperature, compare=compare,
        hf_batch_size=hf_batch_size, percentiles=_percentiles(metric_percentiles), lora_path=lora_path,
        json_schema=_json_schema(json_schema)))
    if as_json:
        print_json(offline_to_dict(result))
    else:
        render_offline(Console(), result)
