"""`llmctl inspect` and `llmctl license`: what a checkpoint is, and what its license permits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.cli.common import JsonOpt, ModelArg, RevisionOpt


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
    from llmctl.checkpoint.source import resolve_model
    from llmctl.display import print_json, render_inspect
    from llmctl.inspect_report import build_inspect_report

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
    from llmctl.checkpoint.license import check_requirements, detect_license, write_license_files
    from llmctl.checkpoint.source import resolve_model
    from llmctl.display import console, print_json, render_license

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
