"""`llmctl quantize`: GPTQ or AWQ checkpoints, compressed-tensors ones (--scheme), or GGUF files (--format gguf)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmctl.cli.common import JsonOpt, ModelArg, RevisionOpt
from llmctl.errors import LlmctlError


def quantize(
    model: ModelArg = None,
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="folder for the quantized model (default: ./<model>-<AWQ|GPTQ>-<bits>bit), or file "
                                "for --format gguf (default: ./<model>-Q4_K_M.gguf)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace a quantized model already at the output")] = False,
    gptq: Annotated[bool, typer.Option(
        "--gptq", help="GPTQ (symmetric, desc_act false; MoE expert by expert): vLLM's gptq/marlin")] = False,
    awq: Annotated[bool, typer.Option("--awq", help="AWQ (asymmetric, GEMM format)")] = False,
    scheme: Annotated[Optional[str], typer.Option(
        "--scheme", help="compressed-tensors' format, as llm-compressor writes it: w4a16 or w8a16 (llmctl's GPTQ), w8a8 "
                         "(SmoothQuant + GPTQ, int8 activations per token), fp8-dynamic; --format gguf: Q4_K_M, Q8_0")]
        = None,
    output_format: Annotated[str, typer.Option(
        "--format", help="safetensors (a model folder), or gguf: one llama.cpp file, --scheme Q4_K_M (default) or "
                         "Q8_0, each tensor typed as llama-quantize types it")] = "safetensors",
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
    calib_samples: Annotated[int, typer.Option(
        "--calib-samples", help="calibration sequences (AutoAWQ's 128 × 512 tokens took 13 minutes on 2 cores and "
                                "scored no better: docs/quantize.md)")] = 32,
    calib_seq_len: Annotated[int, typer.Option("--calib-seq-len", help="tokens per calibration sequence")] = 256,
    eval_file: Annotated[Optional[Path], typer.Option(
        "--eval", help="held-out text: print perplexity of the original, round-to-nearest and the result")] = None,
    eval_tokens: Annotated[int, typer.Option("--eval-tokens", help="tokens of --eval text to score")] = 4096,
    no_redistribute: Annotated[bool, typer.Option(
        "--no-redistribute", help="local use only: quantize even when the license forbids sharing derivatives")] = False,
    as_json: JsonOpt = False,
) -> None:
    """GPTQ, AWQ or compressed-tensors checkpoints that vLLM, transformers and llmctl load unchanged, or GGUF
    files for llama.cpp."""
    from llmctl.display import print_json, render_quantize
    from llmctl.logs import configure_logging
    from llmctl.quant.command import QuantizeOptions, run_quantize

    configure_logging()  # the calibration source and the engine's lines when it samples calibration text
    scheme = _checked_scheme(scheme, gptq, awq, output_format)
    method = "awq" if awq else "gptq"
    if scheme in ("w4a16", "w8a16", "w8a8"):
        bits = int(scheme[1])
    if scheme == "w8a8" and group_size is None:
        group_size = -1  # llm-compressor's W8A8: int8 weights per output channel
    summary = run_quantize(QuantizeOptions(
        model=model, method=method, scheme=scheme, output=output, revision=revision, bits=bits,
        group_size=group_size, act_order=act_order, calib_file=calib_file, calib_samples=calib_samples,
        calib_seq_len=calib_seq_len, eval_file=eval_file, eval_tokens=eval_tokens, redistribute=not no_redistribute,
        show_progress=not as_json, force=force, format=output_format))
    if as_json:
        print_json(summary)
    else:
        render_quantize(summary)


def _checked_scheme(scheme: str | None, gptq: bool, awq: bool, output_format: str) -> str | None:
    """--scheme as run_quantize takes it (GGUF types upper-case); refuses --gptq/--awq where they conflict."""
    if output_format == "gguf" and (gptq or awq):
        raise LlmctlError("--format gguf writes llama.cpp's own types (--scheme Q4_K_M or Q8_0): drop --gptq/--awq")
    if scheme is not None and scheme.upper() in ("Q4_K_M", "Q8_0"):
        scheme = scheme.upper()
    if scheme is not None and (gptq or awq):
        raise LlmctlError("--scheme chooses the method itself (w4a16, w8a16 and w8a8 run GPTQ): drop --gptq/--awq")
    if scheme is None and gptq == awq and output_format != "gguf":
        raise LlmctlError("choose exactly one of --gptq, --awq and --scheme w4a16|w8a16|w8a8|fp8-dynamic")
    return scheme
