"""Tiny GGUF files written in the test, as llama.cpp's convert_hf_to_gguf.py writes them, from a random
transformers model: the architecture's metadata keys, a tokenizer cut from the default model's GGUF (SmolLM2's
first 1,024 tokens and the merges that make them: gguf-py reads a 49,152-token vocabulary in seconds, and each
file is read several times by llmctl and transformers), Gemma norms stored as 1 + w, llama's Q/K rows interleaved,
and every 2-D weight quantized by gguf-py — or, for K-quants (which gguf-py reads but cannot write), random
blocks with small finite scales, mixed as llama.cpp's Q4_K_M mixes them."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from llmctl.checkpoint.gguf_architectures import interleave_rotary
from llmctl.checkpoint.gguf_codes import FORMATS, group_codes
from llmctl.engine.layers.coded_linear import CodedWeight

VOCAB = 1024  # SmolLM2's 17 special tokens, its 256 byte tokens, and the tokens of its first merges
LAYER_NAMES = {  # Hugging Face module → GGUF name, per layer
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
}
GEMMA_NAMES = {**LAYER_NAMES, "pre_feedforward_layernorm": "ffn_norm",
               "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}


# llama.cpp's Q4_K_M: Q4_K, with Q6_K for the embedding, attn_v and ffn_down (llama-quant.cpp's choice for
# most of those layers)
K_MIXES = {"Q4_K_M": ("Q4_K", {"token_embd": "Q6_K", "attn_v": "Q6_K", "ffn_down": "Q6_K"})}


def random_k_blocks(type_name: str, rows: int, columns: int, rng: np.random.Generator,
                    scales: tuple[float, float] = (1e-5, 1e-4)) -> np.ndarray:
    """Raw K-quant blocks of a [rows, columns] tensor: random codes and sub-scales, float16 super-block scales
    (d, and dmin where the type has one) drawn from `scales`."""

    _, block_bytes, per_block, _ = FORMATS[type_name]
    blocks = rng.integers(0, 256, (rows * columns // per_block, block_bytes), dtype=np.uint8)
    halves = rng.uniform(*scales, (blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if type_name == "Q6_K":
        blocks[:, -2:] = halves[:, :2]  # d at the end
    else:
        blocks[:, :4] = halves  # d and dmin first
    return blocks.reshape(rows, -1)


def tiny_config(arch: str, hidden: int = 64) -> Any:
    """A two-layer random model of `arch` over the start of SmolLM2's vocabulary (`hidden` 256 for K-quants'
    super-blocks)."""
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  rope_theta=10000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=arch != "phi3")
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    if arch == "qwen3":
        return transformers.Qwen3Config(head_dim=128, **common)  # transformers reads no head_dim from a qwen3 GGUF
    if arch == "phi3":
        return transformers.Phi3Config(pad_token_id=0, **common)
    if arch == "gemma2":
        return transformers.Gemma2Config(head_dim=16, sliding_window=256, query_pre_attn_scalar=16, **common)
    if arch == "gemma3":  # head size 256 as Gemma 3 1B-12B; a 4-token window that the prompts overrun; six
        # layers, since a GGUF has no layer types and readers take Gemma 3's pattern (the sixth is global); the
        # layers' bases (global 1e6, sliding 1e4) are Gemma 3's defaults, as llama.cpp assumes for the sliding ones
        gemma3 = {key: value for key, value in common.items() if key != "rope_theta"}
        return transformers.Gemma3TextConfig(head_dim=256, sliding_window=4, query_pre_attn_scalar=256,
                                             **{**gemma3, "num_hidden_layers": 6})
    return transformers.LlamaConfig(**common)


def write_tiny_gguf(arch: str, path: Path, default_gguf: Path, qtype: str = "Q8_0") -> torch.nn.Module:
    """Write a random `arch` model to `path`; returns the transformers model it came from."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    k_mix = K_MIXES.get(qtype)
    config = tiny_config(arch, 256 if k_mix else 64)
    rng = np.random.default_rng(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    writer = GGUFWriter(str(path), arch)
    _metadata(writer, arch, config)
    _copy_tokenizer(writer, default_gguf)
    for name, tensor in model.state_dict().items():
        gguf_name = _gguf_name(arch, name)
        if gguf_name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        values = tensor.float().numpy()
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            values = values + 1
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            values = interleave_rotary(values, heads)
        if values.ndim == 2 and k_mix and values.shape[1] % 256 == 0:
            type_name = k_mix[1].get(gguf_name.split(".")[-2], k_mix[0])  # by role: token_embd, attn_v, …
            writer.add_tensor(gguf_name, random_k_blocks(type_name, *values.shape, rng),
                              raw_dtype=GGMLQuantizationType[type_name])
        elif values.ndim == 2 and values.shape[1] % 32 == 0:
            kind = GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name, quantize(np.ascontiguousarray(values), kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


def _metadata(writer: GGUFWriter, arch: str, config: Any) -> None:
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    writer.add_rope_freq_base(getattr(config, "rope_theta", None) or rope.get("full_attention", rope)["rope_theta"])
    writer.add_vocab_size(VOCAB)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    if arch.startswith("gemma"):
        writer.add_sliding_window(config.sliding_window)


def _copy_tokenizer(writer: GGUFWriter, default_gguf: Path) -> None:
    for key, value, vtype, sub_type in _tokenizer_fields(default_gguf):
        writer.add_key_value(key, value, vtype, sub_type=sub_type)


@cache
def _tokenizer_fields(default_gguf: Path) -> list[tuple[str, Any, GGUFValueType, GGUFValueType | None]]:
    """The default GGUF's tokenizer keys, its vocabulary cut to VOCAB tokens and the merges among them (BPE
    numbers a merge's token after the tokens it joins, so the cut is a tokenizer of its own)."""
    reader = GGUFReader(str(default_gguf))
    kept = set(reader.fields["tokenizer.ggml.tokens"].contents()[:VOCAB])
    fields = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value, vtype = field.contents(), field.types[0]
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:VOCAB]
        elif key == "tokenizer.ggml.merges":
            value = [merge for merge in value if set(merge.split(" ")) | {merge.replace(" ", "")} <= kept]
        fields.append((key, value, vtype, field.types[-1] if vtype == GGUFValueType.ARRAY else None))
    return fields


def _gguf_name(arch: str, name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    parts = name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    module, kind = ".".join(parts[3:-1]), parts[-1]
    names = GEMMA_NAMES if arch.startswith("gemma") else LAYER_NAMES
    return f"blk.{parts[2]}.{names[module]}.{kind}" if module in names else None


QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf-py quantizes these; K-quants it only reads


def gguf_tensor(type_name: str, rows: int, columns: int, seed: int) -> np.ndarray:
    """Raw blocks of a [rows, columns] tensor: quantized by gguf-py, or (K-quants) random blocks whose
    float16 super-block scales are finite."""
    from helpers.gguf_models import random_k_blocks

    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[type_name]
    if type_name in QUANTIZABLE:
        return quantize(rng.standard_normal((rows, columns)).astype(np.float32), qtype)
    return random_k_blocks(type_name, rows, columns, rng, scales=(1e-3, 2e-2))


def reference(raw: np.ndarray, type_name: str) -> torch.Tensor:
    return torch.from_numpy(np.array(dequantize(raw, GGMLQuantizationType[type_name]), dtype=np.float32))


def coded_weight(raw: np.ndarray, type_name: str, rows: int, columns: int) -> CodedWeight:
    codes = group_codes(raw, type_name, rows, columns)
    return CodedWeight.compact(torch.from_numpy(codes.stored_codes()), torch.from_numpy(codes.scales),
                               torch.from_numpy(codes.offsets))


def assert_served_as_transformers_reads_it(path: Path, label: str) -> None:
    """A GGUF file served by llmctl against transformers' own GGUF loading of the same file: dequantized
    (--dtype float32) the greedy tokens are identical; coded (int8 activations, as llama.cpp) they agree by vLLM's
    rule for quantized models."""
    from transformers import AutoModelForCausalLM

    from helpers.greedy_close import assert_greedy_close, llmctl_greedy, transformers_greedy
    from llmctl.engine.front.llm import LLM
    from llmctl.engine.sampling_params import SamplingParams

    prompts = [[1, 450, 701, 112, 318], [200, 17, 1000, 4, 5, 6, 7]]
    runs = {}
    for dtype in ("auto", "float32"):
        llm = LLM(str(path), dtype=dtype, max_model_len=128, kv_cache_memory=16 << 20)
        try:
            quantization = llm.engine.executor.loaded.spec.quantization
            assert (quantization is not None and quantization.method == "gguf") == (dtype == "auto")
            runs[dtype] = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                       SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=5))
        finally:
            llm.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
    for prompt, coded, dequantized in zip(prompts, runs["auto"], runs["float32"]):
        expected = transformers_greedy(reference, prompt, 8, 5)
        assert list(dequantized.outputs[0].token_ids) == [token for token, _ in expected], label
        assert_greedy_close(llmctl_greedy(coded.outputs[0]), expected, label)
