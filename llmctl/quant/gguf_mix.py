"""Which GGUF type each tensor gets in a Q4_K_M or Q8_0 file: llama.cpp's choice (llama-quant.cpp's
llama_tensor_get_type for a dense model, no importance matrix), so a file written by `llmctl quantize
--format gguf` holds the types `llama-quantize` would give the same tensors.

Q4_K_M: Q4_K everywhere, but Q6_K for the output projection (and for the token embedding when the two are
tied) and, in the layers where llama.cpp spends more bits (the first and last eighth, every third between),
for attn_v and ffn_down. A tensor whose rows are not a whole number of 256-weight super-blocks falls back
as llama.cpp falls back: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and 32-weight blocks → F16. In a model of 8
experts per layer (Mixtral) attn_k and attn_v take Q8_0 and attn_output Q5_K, as llama.cpp gives them.
1-D tensors (norms, biases) stay F32.
"""

from __future__ import annotations

MIXES = ("Q4_K_M", "Q8_0")
FILE_TYPES = {"F32": 0, "Q8_0": 7, "Q4_K_M": 15}  # general.file_type: llama.cpp's llama_ftype numbers
BLOCK_WEIGHTS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "F16": 1, "F32": 1}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q5_0": "F16", "Q5_1": "F16", "Q8_0": "F16"}


def more_bits(layer: int, layers: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(name: str, dims: int, row_length: int, mix: str, layers: int, tied_embeddings: bool,
                experts: int = 0) -> str:
    """The GGUF type of tensor `name` (GGUF's naming) with `dims` dimensions and rows of `row_length`, in a model
    of `layers` layers with `experts` routed experts per layer (0: dense)."""
    if mix == "F32" or dims < 2 or not name.endswith("weight") or "_norm" in name or "ffn_gate_inp" in name:
        return "F32"
    wanted = "Q8_0" if mix == "Q8_0" else _q4_k_m(name, layers, tied_embeddings, experts)
    while row_length % BLOCK_WEIGHTS[wanted]:
        wanted = _FALLBACK[wanted]
    return wanted


def _q4_k_m(name: str, layers: int, tied_embeddings: bool, experts: int) -> str:
    if name == "output.weight" or (tied_embeddings and name == "token_embd.weight"):
        return "Q6_K"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if experts == 8 and name.endswith(("attn_v.weight", "attn_k.weight")):
        return "Q8_0"  # Mixtral-style 8-expert models: llama.cpp spends ~128 MB more on K and V
    if experts == 8 and name.endswith("attn_output.weight"):
        return "Q5_K"
    if (name.endswith("attn_v.weight") or "ffn_down" in name) and more_bits(layer, layers):
        return "Q6_K"
    return "Q4_K"
