"""`llmctl quantize`: license check, calibration, layer-by-layer quantization, output folder, evaluation."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llmctl.checkpoint.license import LicenseReport, check_requirements, detect_license
from llmctl.checkpoint.source import ModelSource, hub_is_offline, read_json, resolve_model
from llmctl.checkpoint.tokenizer import load_tokenizer
from llmctl.errors import LlmctlError
from llmctl.progress import progress_bar
from llmctl.quant.calibration import calibration_samples, read_texts, token_stream
from llmctl.quant.compressed import SCHEMES, gptq_as_compressed, gptq_scheme_config, round_to_nearest
from llmctl.quant.gguf_mix import MIXES
from llmctl.quant.pipeline import check_supported, quantize_model, working_group_sizes
from llmctl.quant.rtn import QuantConfig
from llmctl.quant.writer import write_companions, write_quantized_model

PILEVAL = ("mit-han-lab/pile-val-backup", "val.jsonl.zst")  # AutoAWQ's default calibration set
logger = logging.getLogger("llmctl.quant")


@dataclass
class QuantizeOptions:
    model: str | None
    method: str  # gptq | awq (--scheme w4a16/w8a16 run gptq), or fp8-dynamic
    scheme: str | None = None  # --scheme: written in compressed-tensors' format (llmctl.quant.compressed)
    output: Path | None = None  # None: ./<model name>-<METHOD>-<bits>bit
    revision: str | None = None
    bits: int = 4
    group_size: int | None = None  # None: 128, or the largest of 64/32 that divides the model's sizes
    act_order: bool = True
    calib_file: Path | None = None
    calib_samples: int = 32  # 32 × 256 tokens: as good as AutoAWQ's 128 × 512 here, a fraction of the time
    calib_seq_len: int = 256
    eval_file: Path | None = None
    eval_tokens: int = 4096
    redistribute: bool = True
    seed: int = 0
    show_progress: bool = True
    force: bool = False  # replace an existing model folder at the output
    format: str = "safetensors"  # or gguf: one llama.cpp file, --scheme Q4_K_M or Q8_0 (llmctl.quant.gguf_export)


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
    calibration: str = ""  # where the calibration tokens came from
    perplexity: dict[str, float] = field(default_factory=dict)  # original / rtn / gptq|awq
    written: list[str] = field(default_factory=list)
    gguf_types: dict[str, int] = field(default_factory=dict)  # --format gguf: tensors per GGUF type


def run_quantize(options: QuantizeOptions) -> QuantizeSummary:
    _check_options(options)
    source = resolve_model(options.model, options.revision, weights=True, show_progress=options.show_progress)
    default_method = options.scheme or ("Q4_K_M" if options.format == "gguf" else options.method)
    output = options.output or default_output(source, default_method, options.bits)
    if options.format == "gguf" and output.is_dir():
        raise LlmctlError(f"{output} is a folder: --format gguf writes one file, give --output NAME.gguf")
    _check_output(output, options.force)
    report = detect_license(source)
    if options.redistribute:
        failures = check_requirements(report, ["derivatives"])
        if failures:
            raise LlmctlError(f"refusing to make a redistributable quantized copy — {failures[0]}. Pass "
                              "--no-redistribute to quantize for local use only")
    if options.format == "gguf":
        return _run_gguf(options, source, output)
    _check_scheme_fits(options, source)
    if options.scheme == "fp8-dynamic":
        return _run_fp8_dynamic(options, source, output, report)
    config = QuantConfig(bits=options.bits, group_size=_group_size(options, source),
                         symmetric=options.method == "gptq", act_order=options.act_order)
    tokenizer = load_tokenizer(source)
    calibration, calibration_source = _calibration(options, source, tokenizer)
    logger.info("calibration: %d × %d tokens from %s", calibration.shape[0], calibration.shape[1],
                calibration_source)
    started = time.perf_counter()
    model_config = read_json(source.path / "config.json")
    layers = int(model_config.get("num_hidden_layers") or model_config.get("text_config", {}).get("num_hidden_layers")
                 or 0)
    steps = "SmoothQuant + GPTQ" if options.scheme == "w8a8" else options.method.upper()
    with progress_bar(f"{steps} {options.bits}-bit, layer by layer", layers,
                      enabled=options.show_progress) as advance:
        result = quantize_model(source.path, options.method, config, calibration, lambda done, total: advance(),
                                smooth=options.scheme == "w8a8")
    seconds = time.perf_counter() - started
    base_model = source.repo_id or options.model or source.name
    if options.force and output.exists():
        shutil.rmtree(output)  # only a model folder gets here (_check_output)
    tensors, compressed = result.tensors, None
    if options.scheme is not None:  # w4a16 / w8a16 / w8a8: the same GPTQ integers in compressed-tensors' format
        w8a8 = options.scheme == "w8a8"
        tensors = gptq_as_compressed(result.tensors, config.bits, config.group_size, packed=not w8a8)
        compressed = gptq_scheme_config(config.bits, config.group_size, ["lm_head", *result.dense_towers], w8a8)
    written = write_quantized_model(output, source, tensors, options.method, config, report, base_model,
                                    result.dense_towers, compressed)
    summary = QuantizeSummary(
        model=source.name, method=options.scheme or options.method, bits=options.bits, group_size=config.group_size,
        layers=len(result.layers), size_before=_weights_bytes(source), seconds=seconds, output=output,
        calibration=calibration_source, size_after=sum(t.numel() * t.element_size() for t in tensors.values()),
        written=[str(p) for p in written],
    )
    if options.eval_file:
        summary.perplexity = _evaluate(source, options, tokenizer, calibration, config, result.dequantized)
    return summary


def _run_gguf(options: QuantizeOptions, source: ModelSource, output: Path) -> QuantizeSummary:
    """One GGUF file, typed as llama-quantize types it; no calibration (llama.cpp's K-quants need none)."""
    from collections import Counter

    from llmctl.quant.gguf_export import export_gguf, tensor_count

    mix = options.scheme or "Q4_K_M"
    name = (source.repo_id or options.model or source.name).rstrip("/").split("/")[-1].removesuffix(".gguf")
    if source.gguf_path is not None:
        logger.info("%s is already a GGUF: its weights are dequantized and quantized again (llama-quantize's "
                    "--allow-requantize), which loses more than quantizing the original checkpoint", source.name)
    started = time.perf_counter()
    with progress_bar(f"GGUF {mix}, tensor by tensor", tensor_count(source.path), enabled=options.show_progress) as advance:
        written = export_gguf(source.path, output, mix, name, lambda done, total: advance())
    bits = 8 if mix == "Q8_0" else 4
    layers = int(read_json(source.path / "config.json")["num_hidden_layers"])
    return QuantizeSummary(model=source.name, method=mix, bits=bits, group_size=32, layers=layers,
                           size_before=_weights_bytes(source), size_after=output.stat().st_size,
                           seconds=time.perf_counter() - started, output=output, calibration="none (not needed)",
                           written=[str(output)], gguf_types=dict(Counter(written.types.values())))


def _check_scheme_fits(options: QuantizeOptions, source: ModelSource) -> None:
    from llmctl.checkpoint.config_file import load_spec

    if options.scheme is not None and load_spec(source).moe is not None:
        # transformers 5 stacks experts into tensors compressed-tensors' Linear targets do not reach
        raise LlmctlError(f"--scheme {options.scheme} does not quantize mixture-of-experts models yet: their "
                          "experts would stay 16-bit; use --gptq (expert by expert), or serve the model as it is")


def _run_fp8_dynamic(options: QuantizeOptions, source: ModelSource, output: Path,
                     report: LicenseReport) -> QuantizeSummary:
    """llm-compressor's FP8_DYNAMIC recipe: no calibration, compressed-tensors does the rest."""
    started = time.perf_counter()
    if options.force and output.exists():
        shutil.rmtree(output)  # only a model folder gets here (_check_output)
    round_to_nearest(source.path, output, "FP8_DYNAMIC")
    base_model = source.repo_id or options.model or source.name
    written = write_companions(output, source, report, base_model, "FP8-dynamic (float8 e4m3 weights per channel, "
                               "activations per token)", ["fp8", "compressed-tensors"])
    weights = [p for p in output.iterdir() if p.suffix == ".safetensors"]
    return QuantizeSummary(model=source.name, method="fp8-dynamic", bits=8, group_size=-1, layers=0,
                           size_before=_weights_bytes(source), size_after=sum(p.stat().st_size for p in weights),
                           seconds=time.perf_counter() - started, output=output, calibration="none (not needed)",
                           written=[str(p) for p in [*weights, output / "config.json", *written]])


def _check_options(options: QuantizeOptions) -> None:
    if options.format not in ("safetensors", "gguf"):
        raise LlmctlError(f"--format {options.format!r}: choose safetensors or gguf")
    if options.format == "gguf":
        if options.scheme not in (None, *MIXES):
            raise LlmctlError(f"--format gguf writes --scheme {' or '.join(MIXES)} (llama.cpp's types), not "
                              f"{options.scheme!r}")
        return
    if options.scheme in MIXES:
        raise LlmctlError(f"--scheme {options.scheme} is a GGUF type: add --format gguf")
    if options.scheme is not None and options.scheme not in SCHEMES:
        raise LlmctlError(f"--scheme {options.scheme!r}: choose one of {', '.join(SCHEMES)}")
    if options.scheme == "fp8-dynamic":
        return
    if options.scheme == "w8a8" and (options.bits, options.group_size) != (8, -1):
        raise LlmctlError("--scheme w8a8 quantizes weights to 8 bits per output channel: drop --bits and --group-size")
    if options.method not in ("gptq", "awq"):
        raise LlmctlError("choose --gptq or --awq")
    if options.bits not in (4, 8) or (options.method == "awq" and options.bits != 4):
        raise LlmctlError("--bits must be 4 (GPTQ also takes 8; AWQ's GEMM format is 4-bit only)")
    if options.group_size is not None and options.group_size != -1 and options.group_size < 16:
        raise LlmctlError("--group-size must be -1 (per channel) or at least 16, e.g. 128 or 64")
    if options.calib_samples < 1 or options.calib_seq_len < 16:
        raise LlmctlError("--calib-samples must be at least 1 and --calib-seq-len at least 16")


def _group_size(options: QuantizeOptions, source: ModelSource) -> int:
    """--group-size, checked against the model before any work; by default 128 where it divides the
    model's sizes, else the largest group size that does (SmolLM2's 576 takes 64)."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(source.path), trust_remote_code=False)
    if options.group_size is not None:
        check_supported(hf_config, QuantConfig(options.bits, options.group_size), options.method)
        return options.group_size
    check_supported(hf_config, QuantConfig(options.bits, -1), options.method)
    works = working_group_sizes(hf_config)
    size = 128 if 128 in works else max(works, default=-1)
    if size != 128:
        logger.info("group size %s: 128 does not divide this model's hidden and intermediate sizes", size)
    return size


def default_output(source: ModelSource, method: str, bits: int) -> Path:
    """./SmolLM2-135M-Instruct-AWQ-4bit (or -W4A16, -FP8-DYNAMIC for a --scheme, -Q4_K_M.gguf for a GGUF): the
    model's name, the method and the bits, in the current folder."""
    name = (source.repo_id or source.name).rstrip("/").split("/")[-1].removesuffix(".gguf")
    if method in MIXES:
        return Path(f"{name}-{method}.gguf")
    return Path(f"{name}-{method.upper()}" if method in SCHEMES else f"{name}-{method.upper()}-{bits}bit")


def _check_output(output: Path, force: bool) -> None:
    if not output.exists() or (output.is_dir() and not any(output.iterdir())):
        return
    if output.is_file():  # a GGUF file: --force replaces only another GGUF
        if not force or output.suffix != ".gguf":
            raise LlmctlError(f"{output} exists: pass --force to replace it (a .gguf file), or --output NEW_FILE")
        return
    if not force:
        raise LlmctlError(f"{output} exists and is not empty: pass --force to replace it, or --output NEW_FOLDER")
    if not (output / "config.json").is_file():  # --force replaces a model folder, never anything else
        raise LlmctlError(f"{output} is not a model folder (no config.json): --force only replaces a previous "
                          "quantized model; choose another --output")


def _calibration(options: QuantizeOptions, source: ModelSource, tokenizer) -> tuple[torch.Tensor, str]:
    """--calib-file; else pileval from the hub; else, when the hub cannot be reached, the model's own samples."""
    calib_file = options.calib_file or _download_pileval()
    if calib_file is None:
        from llmctl.quant.self_calibration import SOURCE_NAME, self_calibration

        logger.info("no --calib-file and the hub is out of reach: calibrating on %s", SOURCE_NAME)
        ids = self_calibration(str(source.path), tokenizer, options.calib_samples, options.calib_seq_len,
                               options.seed)
        return ids, SOURCE_NAME
    holdout = options.eval_tokens if options.eval_file and \
        Path(options.eval_file).resolve() == Path(calib_file).resolve() else 0
    ids = calibration_samples(tokenizer, calib_file, options.calib_samples, options.calib_seq_len, options.seed,
                              skip_tail=holdout)
    where = str(options.calib_file) if options.calib_file else f"{PILEVAL[0]} (pileval, from the hub)"
    return ids, where


def _download_pileval() -> Path | None:
    """pileval from the hub; None when the hub cannot be reached (offline mode, or no connection and no
    cached copy); any other failure says why."""
    if hub_is_offline():
        return None
    import zstandard
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        compressed = Path(hf_hub_download(PILEVAL[0], PILEVAL[1], repo_type="dataset", local_files_only=True))
    except LocalEntryNotFoundError:
        compressed = None
    why_not = _hub_unreachable() if compressed is None else None
    if why_not:  # rather than huggingface_hub's half a minute of retries
        logger.info("the hub cannot be reached (%s)", why_not)
        return None
    try:
        compressed = compressed or Path(hf_hub_download(PILEVAL[0], PILEVAL[1], repo_type="dataset"))
    except LocalEntryNotFoundError:  # huggingface_hub's "cannot connect and not in the cache"
        return None
    except Exception as exc:
        cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        raise LlmctlError(f"downloading the default calibration set {PILEVAL[0]} failed ({type(exc).__name__}: "
                          f"{cause}): pass --calib-file FILE (.txt or .jsonl), or fix the hub access") from None
    target = compressed.with_suffix("")
    if not target.exists():
        with open(compressed, "rb") as src, open(target, "wb") as dst:
            zstandard.ZstdDecompressor().copy_stream(src, dst)
    return target


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub answers no request (no DNS, no route, proxy refuses), or None when it answers.

    A HEAD through huggingface_hub's own HTTP client, so HTTPS_PROXY / HTTP_PROXY / NO_PROXY and any
    client the user configured apply exactly as they do to the download that follows."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as exc:  # httpx's transport errors; any HTTP status means someone answered
        return f"{constants.ENDPOINT}: {type(exc).__name__}: {exc}"
    return None


def _weights_bytes(source: ModelSource) -> int:
    from llmctl.checkpoint.weights import safetensors_files

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
