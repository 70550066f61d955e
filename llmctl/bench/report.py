"""Benchmark results as a rich table, as JSON (schema in docs/bench.md) and as PNG charts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from llmctl.bench.client import RequestOutcome
from llmctl.bench.load import LoadPoint
from llmctl.bench.metrics import LATENCY_METRICS, BenchmarkMetrics
from llmctl.bench.offline import OfflineResult, Throughput
from llmctl.bench.serve_bench import PointResult, ServeBenchRun
from llmctl.engine.spec_decode.stats import SpecDecodeStats
from llmctl.errors import LlmctlError
from llmctl.units import GiB

TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _number(value: float) -> float | str:
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def point_to_dict(run: ServeBenchRun, result: PointResult, percentiles: tuple[float, ...]) -> dict[str, Any]:
    """One load point in `vllm bench serve`'s result keys (ms latencies, per-request arrays)."""
    m, load = result.metrics, result.load
    data: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"), "backend": "openai", "model_id": run.model,
        "tokenizer_id": run.tokenizer, "num_prompts": len(load.outcomes),
        "request_rate": _number(load.point.request_rate), "burstiness": load.point.burstiness,
        "max_concurrency": load.point.max_concurrency, "duration": m.duration, "completed": m.completed,
        "failed": m.failed, "total_input_tokens": m.total_input_tokens, "total_output_tokens": m.total_output_tokens,
        "request_throughput": m.request_throughput, "request_goodput": m.request_goodput,
        "output_throughput": m.output_throughput, "total_token_throughput": m.total_token_throughput,
        "max_concurrent_requests": m.max_concurrent_requests,
    }
    for name in run.reported_metrics:
        dist = m.latencies[name]
        data[f"mean_{name}_ms"], data[f"median_{name}_ms"], data[f"std_{name}_ms"] = dist.mean, dist.median, dist.std
        for p in percentiles:
            data[f"p{p:g}_{name}_ms"] = dist.percentiles[p]
    data["server_metrics"] = None if load.server is None else {
        **asdict(load.server), "prefix_cache_hit_rate": load.server.prefix_cache_hit_rate,
        "spec_decode": spec_decode_to_dict(load.server.spec_decode)}
    data.update({
        "input_lens": [o.prompt_len for o in load.outcomes], "output_lens": m.output_lens,
        "ttfts": [o.ttft for o in load.outcomes], "itls": [o.itl for o in load.outcomes],
        "e2els": [o.latency for o in load.outcomes], "start_times": [o.start_time - load.outcomes[0].start_time
                                                                      for o in load.outcomes],
        "generated_texts": [o.generated_text for o in load.outcomes], "errors": m.errors,
    })
    return data


def run_to_json(run: ServeBenchRun, percentiles: tuple[float, ...]) -> dict[str, Any]:
    """A single load point is one object; a sweep is {"sweep": [point, ...]}."""
    points = [point_to_dict(run, p, percentiles) for p in run.points]
    return points[0] if len(points) == 1 else {"model_id": run.model, "sweep": points}


def save_json(data: dict[str, Any], path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as error:
        raise LlmctlError(f"cannot write {path}: {error.strerror}") from None


def metrics_table(title: str, m: BenchmarkMetrics, percentiles: tuple[float, ...], extra: dict[str, str],
                  reported: tuple[str, ...] = LATENCY_METRICS) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [("Successful requests", f"{m.completed}"), ("Failed requests", f"{m.failed}"),
            ("Benchmark duration (s)", f"{m.duration:.2f}"), ("Total input tokens", f"{m.total_input_tokens}"),
            ("Total generated tokens", f"{m.total_output_tokens}"),
            ("Request throughput (req/s)", f"{m.request_throughput:.2f}")]
    if m.request_goodput is not None:
        rows.append(("Request goodput (req/s)", f"{m.request_goodput:.2f}"))
    rows += [("Output token throughput (tok/s)", f"{m.output_throughput:.2f}"),
             ("Total token throughput (tok/s)", f"{m.total_token_throughput:.2f}"),
             ("Peak concurrent requests", f"{m.max_concurrent_requests}")]
    for label, value in rows:
        table.add_row(label, value)
    for name in reported:
        dist = m.latencies[name]
        table.add_row(f"{TITLES[name]} mean / median (ms)", f"{dist.mean:.2f} / {dist.median:.2f}")
        table.add_row(f"{TITLES[name]} " + " / ".join(f"p{p:g}" for p in percentiles) + " (ms)",
                      " / ".join(f"{dist.percentiles[p]:.2f}" for p in percentiles))
    for label, value in extra.items():
        table.add_row(label, value)
    return table


def server_rows(result: PointResult) -> dict[str, str]:
    stats = result.load.server
    if stats is None:
        return {"Server metrics": "not exposed (no Prometheus /metrics)"}
    rows = {}
    if stats.kv_cache_usage_peak is not None:
        rows["KV-cache usage peak / mean"] = f"{stats.kv_cache_usage_peak:.1%} / {stats.kv_cache_usage_mean:.1%}"
    if stats.preemptions is not None:
        rows["Preemptions"] = str(stats.preemptions)
    if stats.prefix_cache_hit_rate is not None:
        rows["Prefix-cache hit rate"] = f"{stats.prefix_cache_hit_rate:.1%} of {stats.prefix_cache_queries} tokens"
    return rows | spec_decode_rows(stats.spec_decode)


def spec_decode_rows(stats: SpecDecodeStats | None) -> dict[str, str]:
    """Speculative decoding's acceptance as vLLM's benchmarks print it."""
    if stats is None or not stats.num_drafts:
        return {}
    rows = {"Drafts / draft tokens / accepted": f"{stats.num_drafts} / {stats.num_draft_tokens} / "
                                                f"{stats.num_accepted_tokens}",
            "Acceptance rate": f"{stats.acceptance_rate:.1%}",
            "Mean acceptance length": f"{stats.mean_acceptance_length:.2f}"}
    if any(stats.accepted_per_position):
        rows["Per-position acceptance rate"] = ", ".join(
            f"{count / stats.num_drafts:.2f}" for count in stats.accepted_per_position)
    return rows


def render_run(console: Console, run: ServeBenchRun, percentiles: tuple[float, ...]) -> None:
    for result in run.points:
        extra = server_rows(result)
        failures = [e for e in result.metrics.errors if e]
        for index, error in enumerate(dict.fromkeys(failures)):
            if index == 5:
                break
            extra[f"Error ({failures.count(error)}×)"] = error
        console.print(metrics_table(f"{run.model} · {result.load.point.label()}", result.metrics, percentiles, extra,
                                    run.reported_metrics))
    if len(run.points) > 1:
        console.print(sweep_table(run, percentiles))


def sweep_table(run: ServeBenchRun, percentiles: tuple[float, ...]) -> Table:
    top = max(percentiles)
    table = Table(title="Latency–throughput curve")
    for column in ("rate (req/s)", "max conc.", "req/s", "output tok/s", "median TTFT ms", f"p{top:g} TTFT ms",
                   "median TPOT ms", f"p{top:g} TPOT ms", "failed"):
        table.add_column(column, justify="right")
    for result in run.points:
        m, point = result.metrics, result.load.point
        ttft, tpot = m.latencies["ttft"], m.latencies["tpot"]
        table.add_row(str(_number(point.request_rate)), str(point.max_concurrency or "-"),
                      f"{m.request_throughput:.2f}", f"{m.output_throughput:.1f}",
                      f"{ttft.median:.1f}", f"{ttft.percentiles[top]:.1f}", f"{tpot.median:.1f}",
                      f"{tpot.percentiles[top]:.1f}", str(m.failed))
    return table


def write_plots(run: ServeBenchRun, folder: Path, percentiles: tuple[float, ...]) -> list[Path]:
    """PNG charts: TTFT and ITL distributions per load point, and the latency–throughput curve of a sweep."""
    try:
        import matplotlib
    except ImportError:
        raise LlmctlError("--plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, values_of in (("ttft", lambda r: [o.ttft for o in r.load.outcomes if o.success]),
                            ("itl", lambda r: [gap for o in r.load.outcomes if o.success for gap in o.itl])):
        fig, ax = plt.subplots(figsize=(7, 4))
        for result in run.points:
            values = [v * 1000 for v in values_of(result)]
            if values:
                ax.hist(values, bins=40, alpha=0.6, label=result.load.point.label())
        ax.set_xlabel(f"{TITLES[kind]} (ms)")
        ax.set_ylabel("count")
        ax.set_title(f"{TITLES[kind]} distribution · {run.model}")
        ax.legend(fontsize="small")
        written.append(_save(fig, folder / f"{kind}_distribution.png"))
    if len(run.points) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        top = max(percentiles)
        throughput = [r.metrics.output_throughput for r in run.points]
        for name in ("ttft", "tpot"):
            ax.plot(throughput, [r.metrics.latencies[name].median for r in run.points], marker="o",
                    label=f"median {TITLES[name]}")
            ax.plot(throughput, [r.metrics.latencies[name].percentiles[top] for r in run.points],
                    marker="x", linestyle="--", label=f"p{top:g} {TITLES[name]}")
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.set_title(f"Latency vs throughput · {run.model}")
        ax.legend(fontsize="small")
        written.append(_save(fig, folder / "latency_vs_throughput.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


@contextmanager
def bench_progress(console: Console) -> Iterator[Callable[[LoadPoint, int], Callable[[RequestOutcome], None]]]:
    """A live progress bar per load point; yields the factory run_serve_bench calls per point."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        def start_point(point: LoadPoint, total: int) -> Callable[[RequestOutcome], None]:
            task = progress.add_task(point.label(), total=total, failed=0)
            failed = 0

            def done(outcome: RequestOutcome) -> None:
                nonlocal failed
                failed += not outcome.success
                progress.update(task, advance=1, failed=failed)
            return done
        yield start_point


def offline_to_dict(result: OfflineResult) -> dict[str, Any]:
    def throughput(t: Throughput) -> dict[str, Any]:
        return {"seconds": t.seconds, "requests": t.requests, "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens, "requests_per_s": t.requests_per_s,
                "output_tokens_per_s": t.output_tokens_per_s, "total_tokens_per_s": t.total_tokens_per_s}
    return {"model_id": result.model, "llmctl": throughput(result.llmctl), "ttft_ms": asdict(result.ttft),
            "tpot_ms": asdict(result.tpot), "preemptions": result.preemptions,
            "transformers": throughput(result.transformers) if result.transformers else None,
            "transformers_on": result.transformers_on or None,
            "ratio_output_tokens_per_s": result.ratio, "spec_decode": spec_decode_to_dict(result.spec_decode),
            "lora_adapters": result.lora_adapters, "startup_s": result.startup_seconds,
            "ranks": [{"weights_bytes": weights, "kv_cache_bytes": kv} for weights, kv in result.rank_memory]}


def spec_decode_to_dict(stats: SpecDecodeStats | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {**asdict(stats), "acceptance_rate": stats.acceptance_rate,
            "mean_acceptance_length": stats.mean_acceptance_length}


def render_offline(console: Console, result: OfflineResult) -> None:
    table = Table(title=f"Offline · {result.model}")
    for column in ("engine", "seconds", "requests/s", "output tok/s", "total tok/s"):
        table.add_column(column, justify="right")
    runs = [("llmctl", result.llmctl)] + \
        ([(f"transformers ({result.transformers_on})", result.transformers)] if result.transformers else [])
    for name, t in runs:
        table.add_row(name, f"{t.seconds:.2f}", f"{t.requests_per_s:.2f}", f"{t.output_tokens_per_s:.1f}",
                      f"{t.total_tokens_per_s:.1f}")
    console.print(table)
    percentiles = " / ".join(f"p{p:g}" for p in result.ttft.percentiles)
    for name, dist in (("TTFT", result.ttft), ("TPOT", result.tpot)):
        values = " / ".join(f"{v:.1f}" for v in dist.percentiles.values())
        console.print(f"llmctl {name} (engine timings): mean {dist.mean:.1f} ms, median {dist.median:.1f} ms, "
                      f"{percentiles} {values} ms")
    console.print(f"preemptions: {result.preemptions}")
    console.print(f"startup: {result.startup_seconds:.1f} s")
    for index, (weights, kv) in enumerate(result.rank_memory):
        console.print(f"rank {index}: weights {weights / GiB:.3f} GiB, KV cache {kv / GiB:.3f} GiB")
    if result.lora_adapters:
        console.print(f"LoRA: requests spread over {result.lora_adapters} adapters")
    for label, value in spec_decode_rows(result.spec_decode).items():
        console.print(f"speculative decoding, {label.lower()}: {value}")
    if result.ratio is not None:
        console.print(f"output tokens/s, llmctl / transformers: [bold]{result.ratio:.2f}x[/]")
