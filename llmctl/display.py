"""Rendering of command results: rich tables for people, JSON for machines."""

from __future__ import annotations

import dataclasses
import enum
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from llmctl.checkpoint.license import LicenseReport
from llmctl.checkpoint.license_db import Term
from llmctl.checkpoint.quant_schemes import describe as describe_quantization
from llmctl.checkpoint.spec import ModelSpec
from llmctl.inspect_report import InspectReport
from llmctl.plan.planner import LayoutPlan
from llmctl.plan.planner import Plan as PlanResult

console = Console()

_VERDICT_STYLE = {"yes": "green", "no": "red", "conditional": "yellow"}
SERVE_VERDICTS = {"encoder": "runs it through transformers' encoder modules: /v1/embeddings for an embedding "
                            "model, /score, /rerank and /classify for a cross-encoder",
                  "llmctl": "runs this architecture with llmctl's own implementation",
                  "transformers": "runs it as transformers' modules around llmctl's paged attention "
                                  "(--model-impl transformers: one process, no TP or PP)"}


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False))


def human_bytes(count: int | None) -> str:
    if count is None:
        return "?"
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{count} B"


def human_count(count: int | None) -> str:
    if count is None:
        return "?"
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= threshold:
            return f"{count:,} ({count / threshold:.2f}{suffix})"
    return f"{count:,}"


def _facts_table(title: str) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    return table


def render_inspect(report: InspectReport) -> None:
    spec, src = report.spec, report.source
    console.print(f"[bold]{src.name}[/bold]  ({src.kind.value}: {src.path})")
    if src.commit or src.revision:
        console.print(f"revision: {src.revision or 'main'}" + (f" @ {src.commit}" if src.commit else ""))
    if src.note:
        console.print(f"[dim]{src.note}[/dim]")
    console.print(_architecture_table(report))
    console.print(_size_table(report))
    console.print(_tokenizer_table(report))
    if report.text_tokens is not None:
        console.print(_tokens_table(report.text_tokens))
    console.print(_misc_table(report))
    for note in spec.notes:
        console.print(f"[dim]note: {note}[/dim]")
    for warning in report.warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]")


def render_adapter(name: str, report: Any) -> None:
    """`llmctl inspect ADAPTER_DIR` (an llmctl.engine.lora.adapter.AdapterReport)."""
    config = report.config
    console.print(f"[bold]{name}[/bold]  (PEFT LoRA adapter: {report.path})")
    table = _facts_table("Adapter")
    table.add_row("base model", config.base_model or "not named")
    table.add_row("rank", f"{report.rank}" + (" (rsLoRA: scale alpha/√r)" if config.use_rslora else ""))
    table.add_row("alpha", f"{config.alpha:g}")
    table.add_row("targets", ", ".join(report.targets) + f" in {report.layers} layers")
    table.add_row("parameters", f"{human_count(report.num_params)}, {human_bytes(report.nbytes)} on disk")
    verdict = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "[yellow]unchecked[/yellow]"}[report.fits]
    table.add_row("fits the base", f"{verdict}: {report.fit_note}")
    table.add_row("serve with", f"llmctl serve {config.base_model or 'BASE'} --enable-lora --lora-modules "
                                f"NAME={report.path} --max-lora-rank {report.rank}")
    console.print(table)


def _attention_rows(table: Table, spec: ModelSpec) -> None:
    att = spec.attention
    if not any(map(spec.attends, range(spec.num_layers))):
        table.add_row("attention", "none: every layer keeps a recurrent state")
        return
    table.add_row("attention", f"{att.kind}: {att.num_heads} query / {att.num_kv_heads} KV, head_dim {att.head_dim}")
    if att.kind == "MLA":
        table.add_row("MLA ranks", f"q_lora {att.q_lora_rank}, kv_lora {att.kv_lora_rank}, qk_nope "
                                   f"{att.qk_nope_head_dim}, qk_rope {att.qk_rope_head_dim}, v {att.v_head_dim}")
    if att.sliding_window:
        table.add_row("chunked attention" if att.chunked else "sliding window",
                      f"{att.sliding_window} tokens on {att.sliding_layers} of {len(att.layer_types)} layers")
    if att.sinks:
        table.add_row("attention sinks", "a learned logit per head in every softmax")
    if att.qk_norm:
        table.add_row("QK norm", "over the whole q and k projections" if att.qk_norm_whole else "per head")


def _architecture_table(report: InspectReport) -> Table:
    spec = report.spec
    table = _facts_table("Architecture")
    table.add_row("model_type", spec.model_type)
    table.add_row("architectures", ", ".join(spec.architectures) or "?")
    table.add_row("structure", spec.structure)
    table.add_row("layers", str(spec.num_layers))
    if spec.recurrent is not None or (spec.moe and spec.moe.dense_layers) or spec.attention.sliding_layers:
        table.add_row("layer pattern", spec.layer_pattern())
    if spec.mixer is not None:
        table.add_row(spec.mixer.label, spec.mixer.describe())
    table.add_row("hidden size", str(spec.hidden_size))
    has_mlp = bool(spec.intermediate_size or spec.moe)
    table.add_row("intermediate size", str(spec.intermediate_size) if has_mlp else "none (no MLP)")
    _attention_rows(table, spec)
    table.add_row("positional encoding", spec.positional.describe())
    table.add_row("context length", f"{spec.max_context:,} ({spec.context_source})")
    table.add_row("vocab size", f"{spec.vocab_size:,}")
    if report.vision is not None:
        table.add_row("vision tower", report.vision.describe())
    if report.pooling is not None:
        table.add_row("pooling", report.pooling.describe())
    if spec.moe:
        moe = spec.moe
        shared = f", {moe.num_shared_experts} shared" if moe.num_shared_experts else ""
        table.add_row("MoE", f"{moe.num_experts} experts, top-{moe.top_k}{shared}, expert intermediate "
                             f"{moe.expert_intermediate_size}; {len(moe.moe_layers)} MoE layers, "
                             f"{len(moe.dense_layers)} dense")
    lay = spec.layout
    table.add_row("norm", f"{lay.norm}" + (", parallel residual" if lay.parallel_residual else ""))
    biases = [name for name, on in (("qkv", lay.qkv_bias), ("o", lay.o_bias), ("mlp", lay.mlp_bias),
                                    ("lm_head", lay.lm_head_bias)) if on]
    table.add_row("biases", ", ".join(biases) or "none")
    if has_mlp:
        table.add_row("MLP", ("gated" if lay.gated_mlp else "plain") + (f" ({spec.activation})" if spec.activation
                                                                         else ""))
    table.add_row("tied embeddings", "yes" if spec.tie_word_embeddings else "no")
    table.add_row("dtype", spec.torch_dtype or "not stated")
    table.add_row("quantization", describe_quantization(spec.quantization) if spec.quantization else "none")
    table.add_row("remote code", "required (auto_map)" if spec.requires_remote_code
                  else ("auto_map present, natively supported" if spec.auto_map else "not needed"))
    return table


def _size_table(report: InspectReport) -> Table:
    w = report.weights
    table = _facts_table("Parameters and size")
    table.add_row("parameters", human_count(w.params) + f"  [dim]from {w.origin}[/dim]")
    if w.params_from_headers is not None and w.params_from_config is not None:
        check = "[green]agrees[/green]" if w.counts_agree else "[red]differs[/red]"
        table.add_row("from config", f"{w.params_from_config:,} ({check})")
    if report.spec.moe and w.active_params:
        table.add_row("active per token", human_count(w.active_params))
    if w.mtp_params:
        table.add_row("MTP layers (apart)", human_count(w.mtp_params))
    for dtype, size in sorted(w.bytes_by_dtype.items()):
        table.add_row(f"bytes {dtype}", human_bytes(size))
    if w.index_total_size is not None:
        table.add_row("index total_size", f"{w.index_total_size:,} B ({human_bytes(w.index_total_size)})")
    if w.buffer_elements:
        table.add_row("buffers (apart)", f"{w.buffer_elements:,} elements")
    if w.quant_metadata_elements:
        table.add_row("quant scales/zeros (apart)", f"{w.quant_metadata_elements:,} elements")
    if w.note:
        table.add_row("note", w.note)
    if report.gguf_tensor_types:
        table.add_row("GGUF tensor types", _gguf_types(report.gguf_tensor_types))
    kv = f"{report.kv_bytes_per_token_16bit:,} B at 16-bit"
    if report.spec.dtype_bytes != 2:
        kv += f", {report.kv_bytes_per_token_model_dtype:,} B at {report.spec.torch_dtype}"
    table.add_row("KV cache per token", kv)
    if report.spec.mixer is not None:
        state = report.spec.state_bytes_per_sequence(2)
        table.add_row("state per sequence", f"{state:,} B at 16-bit ({human_bytes(state)}), whatever its length: "
                                            f"each {report.spec.mixer.label} layer's convolution window and "
                                            "recurrent state")
    return table


def _gguf_types(types: list[Any]) -> str:
    """"Q4_1 79.0 % (60.1 MiB), Q8_0 …; on CPUs Q4_1, Q8_0 run as they are, F32 as float32"."""
    total = sum(t.weights for t in types) or 1
    shares = ", ".join(f"{t.name} {100 * t.weights / total:.1f} % ({human_bytes(t.nbytes)})" for t in types)
    kept = [t.name for t in types if t.kept_coded]
    rest = [t.name for t in types if not t.kept_coded]
    served = [f"{', '.join(kept)} as they are"] if kept else []
    served += [f"{', '.join(rest)} as float32"] if rest else []
    return f"{shares}; the CPU engine runs {', '.join(served)}"


def _tokenizer_table(report: InspectReport) -> Table:
    tok = report.tokenizer
    table = _facts_table("Tokenizer")
    table.add_row("class", tok.tokenizer_class or "?")
    table.add_row("vocab size", f"{tok.vocab_size:,} ({tok.vocab_source})" if tok.vocab_size else "?")
    for key, text in tok.special_tokens.items():
        token_id = tok.special_token_ids.get(key)
        table.add_row(key.replace("_token", ""), "-" if text is None else
                      f"{text!r}" + (f" (id {token_id})" if token_id is not None else ""))
    if tok.model_max_length:
        table.add_row("model_max_length", f"{tok.model_max_length:,}")
    template = tok.chat_template
    if report.spec.model_type == "gpt_oss":  # llmctl.server.harmony_prompt, as vLLM serves gpt-oss
        table.add_row("chat template", "harmony, rendered and parsed by openai-harmony (the Jinja template unused)")
    else:
        table.add_row("chat template", "none — chat needs --chat-template" if template.text is None else
                      f"from {template.source}" + (f" (named: {', '.join(template.names)})" if template.names else ""))
    if tok.note:
        table.add_row("note", tok.note)
    return table


def _tokens_table(tokens: list[tuple[int, str]]) -> Table:
    table = Table(title=f"--text: {len(tokens)} tokens", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("id", justify="right")
    table.add_column("piece")
    for position, (token_id, piece) in enumerate(tokens):
        table.add_row(str(position), str(token_id), repr(piece))
    return table


def _misc_table(report: InspectReport) -> Table:
    table = _facts_table("Serving")
    gen = report.generation_defaults
    table.add_row("generation defaults", ", ".join(f"{k}={v}" for k, v in gen.items()) if gen else "none")
    lic = report.license
    if lic.license:
        table.add_row("license", f"{lic.license.id} — commercial use: {_verdict(lic.license.commercial)}")
    else:
        table.add_row("license", f"[yellow]{lic.declared or 'unknown'} — needs human review[/yellow]")
    table.add_row("attention backend", f"{report.backend.backend}: {report.backend.reason}")
    table.add_row("llmctl serve", SERVE_VERDICTS.get(report.implementation, "") or
                  f"does not run it yet ({report.implementation_note})")
    return table


def _verdict(term: Term, *, obligation: bool = False) -> str:
    """Colour a verdict; for obligations (attribution, restrictions) "yes" is the caution."""
    style = _VERDICT_STYLE.get(term.verdict, "white")
    if obligation:
        style = {"yes": "yellow", "no": "green"}.get(term.verdict, style)
    return f"[{style}]{term.verdict}[/{style}]"


def render_license(report: LicenseReport) -> None:
    console.print(f"[bold]{report.model}[/bold]" + (f"  (revision {report.revision})" if report.revision else ""))
    info = report.license
    if info is None:
        console.print(f"[yellow]license: {report.declared or 'not found'} — not in llmctl's knowledge base; "
                      "a human must review the terms[/yellow]")
    else:
        console.print(f"license: [bold]{info.name}[/bold] ({info.id})  {info.url}")
        for line in report.evidence:
            console.print(f"[dim]  found by: {line}[/dim]")
        table = Table(show_header=True, header_style="bold")
        table.add_column("question")
        table.add_column("answer", no_wrap=True)
        table.add_column("details", overflow="fold")
        table.add_column("clause", overflow="fold")
        rows = (("commercial use", info.commercial, False),
                ("redistribute derivatives (e.g. quantized weights)", info.derivatives, False),
                ("attribution required", info.attribution, True),
                ("use restrictions", info.use_restrictions, True),
                ("train other models on outputs", info.output_training, False))
        for question, term, obligation in rows:
            table.add_row(question, _verdict(term, obligation=obligation), term.summary, term.clause)
        console.print(table)
        if info.obligations:
            console.print("[bold]A redistributed derivative must:[/bold]")
            for text in info.obligations:
                console.print(f"  • {text}")
    if report.base_model:
        console.print(f"base model: {report.base_model}")
    for warning in report.warnings:
        console.print(f"[yellow]warning: {warning}[/yellow]")


def plan_to_dict(plan: PlanResult) -> dict[str, Any]:
    """The plan for machines: every layout with its numbers in bytes, tokens and sequences."""
    def layout(l: LayoutPlan) -> dict[str, Any]:
        return {
            "tp": l.tp, "pp": l.pp, "replicas": l.replicas, "gpus_per_replica": l.gpus_per_replica,
            "feasible": l.feasible, "problems": l.problems,
            "weights_bytes_per_gpu": l.weights_bytes, "non_kv_bytes_per_gpu": l.non_kv_bytes,
            "kv_cache_bytes_per_gpu": l.kv_bytes, "kv_blocks": l.kv_blocks, "kv_tokens": l.kv_tokens,
            "max_concurrency": round(l.max_concurrency, 4), "max_model_len_that_fits": l.max_model_len_that_fits,
            "stages": to_jsonable(l.stages),
        }

    req = plan.request
    return {
        "model": plan.model,
        "llmctl_implementation": req.llmctl_impl,  # what llmctl serve runs it with (None: it does not yet)
        "gpu": {"type": req.gpu.key, "name": req.gpu.name, "memory_bytes": req.gpu.memory_bytes,
                "count": req.gpus, "nodes": req.nodes, "gpus_per_node": req.gpus_per_node},
        "settings": {"gpu_memory_utilization": req.gpu_memory_utilization, "dtype": plan.dtype,
                     "weights": plan.weight_format, "kv_cache_dtype_bytes": plan.kv_dtype_bytes,
                     "max_model_len": plan.max_model_len, "max_num_seqs": req.max_num_seqs,
                     "max_num_batched_tokens": req.max_num_batched_tokens, "block_size": req.block_size,
                     "expert_parallel": req.expert_parallel, "min_concurrency": req.min_concurrency},
        "params": {"total": plan.total_params, "active": plan.active_params},
        "kv_bytes_per_token": plan.kv_bytes_per_token_model,
        "state_bytes_per_sequence": plan.state_bytes_per_sequence,
        "recommended": layout(plan.recommended) if plan.recommended else None,
        "layouts": [layout(l) for l in plan.layouts],
        "suggestions": plan.suggestions, "notes": plan.notes, "commands": plan.commands,
        "vllm_log": plan.vllm_log,
    }


def render_plan(plan: PlanResult, gpu_note: str | None = None) -> None:
    req, spec = plan.request, plan.spec
    params = f"{human_count(plan.total_params)} parameters"
    if plan.active_params and plan.total_params and plan.active_params != plan.total_params:
        params += f" ({human_count(plan.active_params)} active per token)"
    console.print(f"[bold]{plan.model}[/bold]  {spec.num_layers} layers, {params}")
    console.print(
        f"{req.gpus} × {req.gpu.name} ({req.gpu.memory_gib:.2f} GiB"
        + (f", {req.nodes} nodes" if req.nodes > 1 else "") + f"), utilization {req.gpu_memory_utilization:g}; "
        f"weights {plan.weight_format}, KV {plan.kv_dtype_bytes * 8}-bit "
        f"({plan.kv_bytes_per_token_model:,} bytes/token before TP); max-model-len {plan.max_model_len:,}")
    if gpu_note:
        console.print(f"[yellow]{gpu_note}[/yellow]")
    table = Table(title="layouts considered", title_justify="left")
    for column in ("TP", "PP", "replicas", "weights/GPU", "other/GPU", "KV/GPU", "KV tokens",
                   f"seqs @ {plan.max_model_len:,}", "verdict"):
        table.add_column(column, justify="right" if column != "verdict" else "left", overflow="fold")
    for l in plan.layouts:
        chosen = l is plan.recommended
        verdict = "[bold green]recommended[/bold green]" if chosen else (
            "[green]fits[/green]" if l.feasible else f"[red]{'; '.join(l.problems)}[/red]")
        has_numbers = bool(l.stages) and l.kv_bytes > 0
        table.add_row(
            str(l.tp), str(l.pp), str(l.replicas),
            human_bytes(l.weights_bytes) if l.stages else "-",
            human_bytes(l.non_kv_bytes) if l.stages else "-",
            human_bytes(max(l.kv_bytes, 0)) if has_numbers else "-",
            f"{l.kv_tokens:,}" if has_numbers else "-",
            f"{l.max_concurrency:.2f}x" if has_numbers else "-",
            verdict,
        )
    console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}")
    best = plan.recommended
    if best is None:
        console.print("[bold red]No layout fits.[/bold red]")
    else:
        replicas = f", {best.replicas} replicas" if best.replicas > 1 else ""
        console.print(f"[bold]Recommended:[/bold] TP {best.tp} × PP {best.pp}{replicas}: "
                      f"{human_bytes(best.weights_bytes)} weights and {human_bytes(max(best.kv_bytes, 0))} KV "
                      f"cache per GPU ({best.kv_blocks:,} blocks of {req.block_size} tokens)")
        for line in plan.vllm_log:
            console.print(f"  {line}")
        if best.max_concurrency < req.min_concurrency:
            console.print(f"[yellow]holds fewer than {req.min_concurrency:g} full-length sequences[/yellow]")
    if plan.suggestions:
        console.print("[bold]What would make it fit:[/bold]")
        for suggestion in plan.suggestions:
            console.print(f"  • {suggestion}")
    if plan.commands:
        console.print("[bold]Run it:[/bold]")
        for command in plan.commands:
            console.print(f"  {command}", highlight=False, soft_wrap=True)


def render_quantize(summary: Any) -> None:
    table = _facts_table(f"{summary.model}: {summary.method.upper()} {summary.bits}-bit")
    table.add_row("layers", str(summary.layers))
    if summary.gguf_types:
        table.add_row("GGUF types", ", ".join(f"{name} × {count}" for name, count in sorted(summary.gguf_types.items())))
    else:
        table.add_row("bits / group", f"{summary.bits} / {summary.group_size}")
    table.add_row("size", f"{human_bytes(summary.size_before)} → {human_bytes(summary.size_after)}")
    table.add_row("time", f"{summary.seconds:.1f} s")
    table.add_row("calibration", summary.calibration)
    table.add_row("output", str(summary.output))
    for name, value in summary.perplexity.items():
        table.add_row(f"perplexity ({name})", f"{value:.2f}")
    console.print(table)
    console.print(f"serve it: llmctl serve {summary.output}")
