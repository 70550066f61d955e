"""`llmctl quantize`: license check, calibration, layer-by-layer quantization, output folder, evaluation."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmctl.errors import LlmctlError
from llmctl.model.license import check_requirements, detect_license
from llmctl.model.source import ModelSource, hub_is_offline, read_json, resolve_model
from llmctl.model.tokenizer import load_tokenizer
from llmctl.progress import progress_bar
from llmctl.quant.calibration import calibration_samples, read_texts, token_stream
from llmctl.quant.pipeline import quantize_model
from llmctl.quant.rtn import QuantConfig
from llmctl.quant.writer import write_quantized_model

PILEVAL = ("mit-han-lab/pile-val-backup", "val.jsonl.zst")  # AutoAWQ's default calibration set


@dataclass
class QuantizeOptions:
    model: str | None
    method: str  # gptq | awq
    output: Path
    revision: str | None = None
    bits: int = 4
    group_size: int = 128
    act_order: bool = True
    calib_file: Path | None = None
    calib_samples: int = 128
    calib_seq_len: int = 512
    eval_file: Path | None = None
    eval_tokens: int = 4096
    redistribute: bool = True
    seed: int = 0
    show_progress: bool = True


@dataclass
class QuantizeSummary:
    model: str
    method: str
    bits: int
    group_size: int
    layers: int
    size_before: int
    size_after: int
    seconds: float
    output: Path
    perplexity: dict[str, float] = field(default_factory=dict)  # original / rtn / gptq|awq
    written: list[str] = field(default_factory=list)


def run_quantize(options: QuantizeOptions) -> QuantizeSummary:
    _check_options(options)
    source = resolve_model(options.model, options.revision, weights=True, show_progress=options.show_progress)
    report = detect_license(source)
    if options.redistribute:
        failures = check_requirements(report, ["derivatives"])
        if failures:
            raise LlmctlError(f"refusing to make a redistributable quantized copy — {failures[0]}. Pass "
                              "--no-redistribute to quantize for local use only")
    tokenizer = load_tokenizer(source)
    calib_file = options.calib_file or _download_pileval()
    holdout = options.eval_tokens if options.eval_file and calib_file and \
        Path(options.eval_file).resolve() == Path(calib_file).resolve() else 0
    calibration = calibration_samples(tokenizer, calib_file, options.calib_samples, options.calib_seq_len,
                                      options.seed, skip_tail=holdout)
    config = QuantConfig(bits=options.bits, group_size=options.group_size, symmetric=options.method == "gptq",
                         act_order=options.act_order)
    started = time.perf_counter()
    layers = int(read_json(source.path / "config.json").get("num_hidden_layers", 0))
    with progress_bar(f"{options.method.upper()} {options.bits}-bit, layer by layer", layers,
                      enabled=options.show_progress) as advance:
        result = quantize_model(source.path, options.method, config, calibration, lambda done, total: advance())
    seconds = time.perf_counter() - started
    base_model = source.repo_id or options.model or source.name
    written = write_quantized_model(options.output, source, result.tensors, options.method, config, report, base_model)
    summary = QuantizeSummary(
        model=source.name, method=options.method, bits=options.bits, group_size=options.group_size,
        layers=len(result.layers), size_before=_weights_bytes(source), seconds=seconds, output=options.output,
        size_after=sum(t.numel() * t.element_size() for t in result.tensors.values()),
        written=[str(p) for p in written],
    )
    if options.eval_file:
        summary.perplexity = _evaluate(source, options, tokenizer, calibration, config, result.dequantized)
    return summary


def _check_options(options: QuantizeOptions) -> None:
    if options.method not in ("gptq", "awq"):
        raise LlmctlError("choose --gptq or --awq")
    if options.bits not in (4, 8) or (options.method == "awq" and options.bits != 4):
        raise LlmctlError("--bits must be 4 (GPTQ also takes 8; AWQ's GEMM format is 4-bit only)")
    if options.group_size != -1 and options.group_size < 16:
        raise LlmctlError("--group-size must be -1 (per channel) or at least 16, e.g. 128 or 64")
    if options.calib_samples < 1 or options.calib_seq_len < 16:
        raise LlmctlError("--calib-samples must be at least 1 and --calib-seq-len at least 16")
    if options.output.exists() and any(options.output.iterdir()):
        raise LlmctlError(f"{options.output} exists and is not empty: choose a new --output folder")


def _download_pileval() -> Path | None:
    """pileval from the hub (None offline: the caller asks for --calib-file); a failed download says why."""
    if hub_is_offline():
        return None
    import zstandard
    from huggingface_hub import hf_hub_download

    try:
        compressed = Path(hf_hub_download(PILEVAL[0], PILEVAL[1], repo_type="dataset"))
    except Exception as exc:
        cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise LlmctlError(f"downloading the default calibration set {PILEVAL[0]} failed ({type(exc).__name__}: "
                          f"{cause}): pass --calib-file FILE (.txt or .jsonl), or fix the hub access") from None
    target = compressed.with_suffix("")
    if not target.exists():
        with open(compressed, "rb") as src, open(target, "wb") as dst:
            zstandard.ZstdDecompressor().copy_stream(src, dst)
    return target


def _weights_bytes(source: ModelSource) -> int:
    from llmctl.engine.weights import safetensors_files

    return sum(p.stat().st_size for p in safetensors_files(source.path))


def _evaluate(source: ModelSource, options: QuantizeOptions, tokenizer, calibration: torch.Tensor,
              config: QuantConfig, dequantized: dict[str, torch.Tensor]) -> dict[str, float]:
    """Perplexity of the original, of plain round-to-nearest (asymmetric) and of the result."""
    from llmctl.quant.evaluate import load_dense_model, perplexity

    ids = token_stream(tokenizer, read_texts(Path(options.eval_file)))[-options.eval_tokens:]
    seq_len = min(options.calib_seq_len, 512)
    rtn = quantize_model(source.path, "rtn", QuantConfig(config.bits, config.group_size, False), calibration[:1])
    return {
        "original": perplexity(load_dense_model(source.path), ids, seq_len),
        "rtn": perplexity(load_dense_model(source.path, rtn.dequantized), ids, seq_len),
        options.method: perplexity(load_dense_model(source.path, dequantized), ids, seq_len),
    }
