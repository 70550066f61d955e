"""One vocabulary for the engine's settings that several parts read: model dtypes, KV-cache formats,
attention backends, model implementations and the shared defaults. The engine (EngineConfig.validate,
the KV cache, the attention choice), the planner, and the CLI flags of `serve` and `plan` all read
these tables, so `plan` cannot print a value `serve` refuses. Names are vLLM's. Torch-free: the light
commands import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.errors import LlmctlError

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default
DEFAULT_BLOCK_SIZE = 16


class SettingError(LlmctlError):
    """A setting's value that no part of llmctl knows; the message lists the ones it does."""


@dataclass(frozen=True)
class ModelDtype:
    name: str
    torch_name: str | None  # None: auto (float32 on CPUs, bfloat16 on GPUs)
    bytes: int | None


@dataclass(frozen=True)
class KVCacheFormat:
    name: str
    torch_name: str | None  # what K and V are stored as; None: the model's dtype
    bytes: int | None  # per element; None: the model's dtype's
    help: str

    @property
    def fp8(self) -> bool:
        return self.torch_name in ("float8_e4m3fn", "float8_e5m2")

    def element_bytes(self, model_dtype_bytes: int) -> int:
        return self.bytes if self.bytes is not None else model_dtype_bytes


DTYPES: dict[str, ModelDtype] = {d.name: d for d in (
    ModelDtype("auto", None, None),
    ModelDtype("float32", "float32", 4),
    ModelDtype("bfloat16", "bfloat16", 2),
    ModelDtype("float16", "float16", 2),
)}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's --dtype takes these too

KV_CACHE_FORMATS: dict[str, KVCacheFormat] = {f.name: f for f in (
    KVCacheFormat("auto", None, None, "the model's dtype"),
    KVCacheFormat("bfloat16", "bfloat16", 2, "half of a float32 model's KV bytes"),
    KVCacheFormat("float16", "float16", 2, "half of a float32 model's KV bytes"),
    KVCacheFormat("fp8", "float8_e4m3fn", 1, "e4m3 with a scale of 1.0: half of bfloat16's"),
    KVCacheFormat("fp8_e4m3", "float8_e4m3fn", 1, "the same as fp8"),
    KVCacheFormat("fp8_e5m2", "float8_e5m2", 1, "e5m2 with a scale of 1.0: a wider range (±57344) than e4m3, one "
                                                "mantissa bit fewer"),
)}

ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")
# vLLM's --attention-backend names for what llmctl has (vLLM's CPU backend was TORCH_SDPA before CPU_ATTN)
VLLM_ATTENTION_BACKENDS = {"TRITON_ATTN": "triton", "CPU_ATTN": "cpu", "TORCH_SDPA": "cpu"}
# vLLM's --load-format values llmctl reads: auto (safetensors, else GGUF; pickles with --allow-pickle-weights),
# safetensors only, pt (PyTorch .bin pickles, read with torch.load weights_only), gguf, dummy (random weights)
LOAD_FORMATS = ("auto", "safetensors", "pt", "gguf", "dummy")
# vLLM's -q names that mean a method llmctl reads from the checkpoint (vLLM's marlin kernels are its own)
QUANTIZATION_ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "compressed_tensors": "compressed-tensors"}
MODEL_IMPLS = ("auto", "llmctl", "vllm", "transformers")  # "vllm": vLLM's name for the native implementation


def model_dtype(name: str) -> ModelDtype:
    """`--dtype NAME` (vLLM's aliases half and float included)."""
    found = DTYPES.get(DTYPE_ALIASES.get(name, name))
    if found is None:
        raise SettingError(f"--dtype {name!r} is not one of {', '.join(DTYPES)} (or vLLM's half, float)")
    return found


def attention_backend(name: str) -> str:
    """`--attention-backend NAME`: llmctl's names, or vLLM's for the same kernels."""
    if name in ATTENTION_BACKENDS:
        return name
    mapped = VLLM_ATTENTION_BACKENDS.get(name.upper())
    if mapped is None:
        vllms = "vLLM's " + name if name.isupper() else repr(name)
        raise SettingError(f"--attention-backend {vllms} is not a backend llmctl has: use {', '.join(ATTENTION_BACKENDS)} "
                           f"(or vLLM's {', '.join(VLLM_ATTENTION_BACKENDS)})")
    return mapped


def kv_cache_format(name: str) -> KVCacheFormat:
    """`--kv-cache-dtype NAME`."""
    found = KV_CACHE_FORMATS.get(name)
    if found is None:
        raise SettingError(f"--kv-cache-dtype {name!r} is not supported; use {', '.join(KV_CACHE_FORMATS)}")
    return found


def kv_cache_help() -> str:
    return "; ".join(f"{f.name} ({f.help})" for f in KV_CACHE_FORMATS.values())
