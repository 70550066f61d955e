"""The output folder of `llmctl quantize`: a complete model vLLM and transformers load unchanged.

Safetensors shards + index, config.json with `quantization_config`, quantize_config.json
(GPTQ), tokenizer files, generation config, chat template, a model card whose front matter
names the base model (`base_model_relation: quantized`), and LICENSE/NOTICE.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import yaml

from llmctl.checkpoint.license import LicenseReport, write_license_files
from llmctl.checkpoint.source import ModelSource, read_json
from llmctl.quant.gptq import DAMPING
from llmctl.quant.rtn import QuantConfig

SHARD_BYTES = 2 * 1024**3
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
                "merges.txt", "added_tokens.json", "generation_config.json", "chat_template.jinja",
                "chat_template.json")


def quantization_config(method: str, config: QuantConfig, dense_towers: tuple[str, ...] = ()) -> dict[str, Any]:
    """dense_towers: modules left unquantized (a multimodal model's vision tower), in each format's own
    field: GPTQModel's `dynamic` with a negative pattern (vLLM reads it), AWQ's `modules_to_not_convert`."""
    if method == "gptq":
        fields = {"quant_method": "gptq", "bits": config.bits, "group_size": config.group_size, "desc_act": False,
                  "sym": True, "damp_percent": DAMPING, "true_sequential": False,
                  "static_groups": config.act_order,  # act-order ran with static groups: g_idx stays in order
                  "checkpoint_format": "gptq"}
        if dense_towers:
            fields["dynamic"] = {f"-:.*({'|'.join(dense_towers)}).*": {}}
        return fields
    return {"quant_method": "awq", "bits": config.bits, "group_size": config.group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": list(dense_towers) or None}


def write_checkpoint(out_dir: Path, tensors: dict[str, torch.Tensor]) -> list[Path]:
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name].contiguous()
        size += nbytes
    paths = []
    if len(shards) == 1:
        paths.append(out_dir / "model.safetensors")
        save_file(shards[0], str(paths[0]), metadata={"format": "pt"})
        return paths
    weight_map = {}
    for index, shard in enumerate(shards, 1):
        path = out_dir / f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path), metadata={"format": "pt"})
        weight_map.update({name: path.name for name in shard})
        paths.append(path)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return paths


def write_quantized_model(out_dir: Path, source: ModelSource, tensors: dict[str, torch.Tensor], method: str,
                          config: QuantConfig, report: LicenseReport, base_model: str,
                          dense_towers: tuple[str, ...] = (), compressed: Any | None = None) -> list[Path]:
    """`compressed`: a compressed-tensors QuantizationConfig (`--scheme w4a16|w8a16`), written into config.json by
    compressed-tensors itself instead of the GPTQ/AWQ fields."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = write_checkpoint(out_dir, tensors)
    model_config = read_json(source.path / "config.json")
    model_config.pop("quantization_config", None)
    if compressed is None:
        model_config["quantization_config"] = quantization_config(method, config, dense_towers)
    model_config["torch_dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(model_config, indent=2))
    written.append(out_dir / "config.json")
    if compressed is not None:
        from llmctl.quant.compressed import write_scheme_config

        write_scheme_config(out_dir, compressed)
    elif method == "gptq":
        (out_dir / "quantize_config.json").write_text(json.dumps(
            {k: v for k, v in quantization_config(method, config, dense_towers).items() if k != "quant_method"},
            indent=2))
        written.append(out_dir / "quantize_config.json")
    what, tags = f"{config.bits}-bit {method.upper()} (group size {config.group_size})", [method, f"{config.bits}-bit"]
    if compressed is not None and compressed.format == "int-quantized":
        what, tags = "W8A8 (SmoothQuant, then GPTQ int8 weights per channel; int8 activations per token)", \
            ["w8a8", "compressed-tensors"]
    return written + write_companions(out_dir, source, report, base_model, what, tags)


def write_companions(out_dir: Path, source: ModelSource, report: LicenseReport, base_model: str, what: str,
                     tags: list[str]) -> list[Path]:
    """Everything beside the weights and config.json: tokenizer and generation files, the model card, LICENSE and
    NOTICE. `what`: the quantization in words ("4-bit GPTQ (group size 128)")."""
    written = []
    for name in COPIED_FILES:
        if (source.path / name).exists():
            shutil.copy(source.path / name, out_dir / name)
            written.append(out_dir / name)
    written.append(_write_card(out_dir, report, base_model, what, tags))
    written += write_license_files(report, out_dir, source, modification=f"quantized to {what} with llmctl")
    return written


def _write_card(out_dir: Path, report: LicenseReport, base_model: str, what: str, tags: list[str]) -> Path:
    front: dict[str, Any] = {"base_model": base_model, "base_model_relation": "quantized",
                             "tags": [*tags, "llmctl"], "library_name": "transformers"}
    if report.declared:
        front["license"] = report.declared
    body = (f"# {base_model} — {what}\n\n"
            f"{what[0].upper() + what[1:]} quantization of "
            f"[{base_model}](https://huggingface.co/{base_model}), made with `llmctl quantize`. "
            "vLLM and transformers load it as is; see LICENSE and NOTICE for the terms of the base model.\n")
    path = out_dir / "README.md"
    path.write_text("---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n\n" + body, encoding="utf-8")
    return path
