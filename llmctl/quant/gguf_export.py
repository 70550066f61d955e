"""`llmctl quantize --format gguf`: a Hugging Face checkpoint written as one GGUF file in Q4_K_M or Q8_0, as
llama.cpp's convert_hf_to_gguf.py followed by `llama-quantize` writes it.

The metadata keys and tensor names of llama.cpp's converter for Llama (and Mistral, written as llama, with Q/K
rows interleaved), Qwen2 and Qwen3 dense models; each tensor's type as llama-quantize chooses it
(llmctl.quant.gguf_mix); K-quant blocks from llmctl.quant.k_quants, Q8_0 and Q5_0 from gguf-py's own
quantizer; the tokenizer as llmctl.quant.gguf_tokenizer writes it. Tensors are read and quantized one at a
time from the safetensors files.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from llmctl.checkpoint.gguf_architectures import ARCHITECTURES, GgufArchitecture, interleave_rotary
from llmctl.errors import LlmctlError
from llmctl.quant.gguf_mix import FILE_TYPES, tensor_type
from llmctl.quant.gguf_tokenizer import write_tokenizer
from llmctl.quant.k_quants import quantize_q4_k, quantize_q5_k, quantize_q6_k

logger = logging.getLogger("llmctl.quant")
K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}
GGUF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                      "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "llama", "Qwen2MoeForCausalLM": "qwen2moe",
                      "Qwen3MoeForCausalLM": "qwen3moe"}
# Each routed expert's projections on disk (Mixtral's w1/w3/w2 included) → the GGUF tensor that stacks them
EXPERT_TENSOR = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                           r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight")
STACKED = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps", "w3": "ffn_up_exps",
           "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}


@dataclass
class GgufTensors:
    """What was written: each tensor's GGUF type, and the file's bytes of tensor data."""

    types: dict[str, str] = field(default_factory=dict)
    data_bytes: int = 0


def export_gguf(folder: Path, output: Path, mix: str, name: str,
                on_tensor: Callable[[int, int], None] = lambda done, total: None) -> GgufTensors:
    """Write the model in `folder` (config.json, safetensors, tokenizer.json) to `output` as a `mix` GGUF
    (Q4_K_M, Q8_0, or F32 for an unquantized file)."""
    from gguf import GGML_QUANT_VERSION, GGUFWriter

    from llmctl.checkpoint.source import read_json

    config = read_json(folder / "config.json")
    arch = gguf_arch_name(config)
    writer = GGUFWriter(str(output), arch)
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[mix])
    writer.add_quantization_version(GGML_QUANT_VERSION)
    write_model_metadata(writer, config)
    write_tokenizer(writer, folder, int(config["vocab_size"]))
    written = GgufTensors()
    total, tensors = _model_tensors(folder, config, ARCHITECTURES[arch])
    for done, (gguf_name, values) in enumerate(tensors, 1):
        kind = tensor_type(gguf_name, values.ndim, values.shape[-1], mix, int(config["num_hidden_layers"]),
                           bool(config.get("tie_word_embeddings")), expert_count(config))
        data = encode(values, kind)
        writer.add_tensor(gguf_name, data, raw_dtype=_ggml_type(kind) if kind not in ("F32", "F16") else None)
        written.types[gguf_name], written.data_bytes = kind, written.data_bytes + data.nbytes
        on_tensor(done, total)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


def tensor_count(folder: Path) -> int:
    """How many tensors export_gguf writes for the model in `folder` (for a progress bar)."""
    from llmctl.checkpoint.source import read_json

    config = read_json(folder / "config.json")
    return _model_tensors(folder, config, ARCHITECTURES[gguf_arch_name(config)])[0]


def gguf_arch_name(config: dict[str, Any]) -> str:
    """llama.cpp's architecture for this config; refuses what the writer cannot represent faithfully."""
    arch = next((GGUF_ARCHITECTURES[a] for a in config.get("architectures") or [] if a in GGUF_ARCHITECTURES), None)
    if arch is None:
        raise LlmctlError(f"--format gguf writes {', '.join(GGUF_ARCHITECTURES)} models; this is "
                          f"{', '.join(config.get('architectures') or ['unknown'])}: quantize it with --gptq, --awq "
                          "or --scheme instead")
    if config.get("quantization_config"):
        raise LlmctlError("--format gguf quantizes a full-precision checkpoint; this one is already quantized "
                          f"({config['quantization_config'].get('quant_method')}): pass the original model")
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise LlmctlError(f"--format gguf does not write {rope.get('rope_type', rope.get('type'))!r} RoPE scaling "
                          "yet: convert this model with llama.cpp's convert_hf_to_gguf.py")
    if arch in ("qwen2moe", "qwen3moe") and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1
                                              or bool(config.get("norm_topk_prob")) != (arch == "qwen3moe")):
        raise LlmctlError("--format gguf: llama.cpp runs every Qwen-MoE layer as experts, renormalising Qwen3-MoE's "
                          "top-k weights and not Qwen2-MoE's; this config differs (mlp_only_layers, "
                          "decoder_sparse_step or norm_topk_prob), so the file would compute another model")
    if config.get("sliding_window") and (arch == "llama" or config.get("use_sliding_window")):
        raise LlmctlError("--format gguf does not write sliding-window attention (llama.cpp's llama "
                          "architecture has none): convert this model with llama.cpp's convert_hf_to_gguf.py")
    return arch


def write_model_metadata(writer: Any, config: dict[str, Any]) -> None:
    """The {arch}.* keys llama.cpp's converter writes for a dense Llama/Qwen model."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    rope = config.get("rope_parameters") or {}
    writer.add_context_length(int(config.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta", 10000.0)))
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    if expert_count(config):
        writer.add_expert_count(expert_count(config))
        writer.add_expert_used_count(int(config["num_experts_per_tok"]))
    if config.get("moe_intermediate_size"):  # Qwen-MoE's experts are narrower than its dense feed-forward
        writer.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(int(config["shared_expert_intermediate_size"]))


def expert_count(config: dict[str, Any]) -> int:
    """Routed experts per layer; 0 for a dense model."""
    return int(config.get("num_local_experts") or config.get("num_experts") or 0)


def _model_tensors(folder: Path, config: dict[str, Any], arch: GgufArchitecture
                   ) -> tuple[int, Iterator[tuple[str, np.ndarray]]]:
    """How many tensors llama.cpp reads, and (GGUF name, float32 values) of each, read one at a time; Q/K rows
    interleaved for llama; the output projection left out when it is the embedding."""
    from safetensors import safe_open

    from llmctl.checkpoint.weights import safetensors_files

    tied = bool(config.get("tie_word_embeddings"))
    wanted: list[tuple[str, list[tuple[Path, str]]]] = []  # GGUF name, and the tensors (path, name) it is made of
    stacks: dict[str, dict[int, tuple[Path, str]]] = {}
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            names = list(handle.keys())
        for hf_name in names:
            if expert := EXPERT_TENSOR.fullmatch(hf_name):
                stacked = f"blk.{expert[1]}.{STACKED[expert[3]]}.weight"
                if stacked not in stacks:
                    stacks[stacked] = {}
                    wanted.append((stacked, []))
                stacks[stacked][int(expert[2])] = (path, hf_name)
            elif (gguf := arch.gguf_name(hf_name.replace("block_sparse_moe.gate.", "mlp.gate."))) and \
                    not (tied and gguf == "output.weight"):
                wanted.append((gguf, [(path, hf_name)]))
    wanted = sorted(((gguf, parts or [stacks[gguf][e] for e in sorted(stacks[gguf])]) for gguf, parts in wanted),
                    key=lambda item: _file_order(item[0]))

    def read() -> Iterator[tuple[str, np.ndarray]]:
        for gguf_name, parts in wanted:
            arrays = [_read(path, hf_name, config, arch) for path, hf_name in parts]
            yield gguf_name, np.ascontiguousarray(np.stack(arrays) if gguf_name.endswith("_exps.weight") else arrays[0])

    return len(wanted), read()


def _file_order(gguf_name: str) -> tuple[int, str]:
    """llama.cpp's order (llama_model_loader's weight_name_comparer): by layer, the layerless first, then by name;
    llama-quantize counts attn_v tensors in this order."""
    layer = int(gguf_name.split(".")[1]) if gguf_name.startswith("blk.") else -1
    return layer, gguf_name


def _read(path: Path, hf_name: str, config: dict[str, Any], arch: GgufArchitecture) -> np.ndarray:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        values = handle.get_tensor(hf_name).float().numpy()
    if arch.interleaved_rotary and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
        heads = config["num_attention_heads"] if "q_proj" in hf_name else config["num_key_value_heads"]
        values = interleave_rotary(values, int(heads))
    return values


def encode(values: np.ndarray, kind: str) -> np.ndarray:
    """A tensor's data as GGUF stores `kind`: blocks for quantized types (uint8 [rows, row bytes])."""
    from gguf import quants

    if kind == "F32":
        return values.astype(np.float32)
    if kind == "F16":
        return values.astype(np.float16)
    if kind in K_QUANTIZERS:  # a 3-D stack of experts is quantized row by row like any matrix
        return K_QUANTIZERS[kind](values.reshape(-1, values.shape[-1])).reshape(*values.shape[:-1], -1)
    return quants.quantize(values.astype(np.float32), _ggml_type(kind))


def _ggml_type(kind: str) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[kind]
