"""Weight bytes per GPU under tensor and pipeline parallelism, in vLLM's sharding.

Every decoder layer is described as the linear layers one tensor-parallel rank holds
(exact input/output sizes, so quantization scales are counted exactly) plus the
unquantized parameters it holds (norms, biases, routers). Column-parallel layers (QKV,
gate/up, fc1) split their outputs by TP, row-parallel layers (o, down, fc2) their inputs;
K/V heads are replicated when TP exceeds them; the vocabulary is padded to a multiple of
64 and split by TP; norms and row-parallel biases are replicated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmctl.checkpoint.quant_schemes import sizing_quantization
from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import LlmctlError

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
QUANT_METHODS = ("awq", "gptq", "fp8", "int8")
MXFP4_BITS = 4 + 8 / 32  # a 4-bit E2M1 code per weight, an 8-bit E8M0 exponent per 32


WEIGHT_DTYPES = {"bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class WeightFormat:
    """How one decoder linear layer of shape (in, out) is stored."""

    name: str  # "bfloat16", "awq", ...
    dense_bytes: int  # bytes per parameter of everything that is not a quantized linear
    bits: float = 16  # a GGUF's: its blocks' bits per weight, scales included
    group_size: int = 0  # 0: not grouped
    scale_kind: str = "none"  # "group" (awq/gptq), "channel" (int8), "tensor" / "block" (fp8), "gguf"
    table_bits: float = 0  # GGUF: the embedding table and LM head stay quantized too (0: dense_bytes each)
    expert_bits: float = 0  # routed experts' bits per weight, scales included (MXFP4: 4.25); 0: as the others

    @property
    def quantized(self) -> bool:
        return self.scale_kind != "none" or self.expert_bits > 0

    def expert_bytes(self, rows_in: int, cols_out: int) -> float:
        """A routed expert's linear: at expert_bits where the format has its own for experts."""
        return rows_in * cols_out * self.expert_bits / 8 if self.expert_bits else self.linear_bytes(rows_in, cols_out)

    def linear_bytes(self, rows_in: int, cols_out: int) -> float:
        weights = rows_in * cols_out * self.bits / 8
        if self.scale_kind == "group":  # fp16 scale + packed zero per group and output column
            groups = math.ceil(rows_in / self.group_size) if self.group_size > 0 else 1
            return weights + groups * cols_out * (2 + self.bits / 8)
        if self.scale_kind == "channel":  # one fp32 scale per output channel
            return weights + 4 * cols_out
        if self.scale_kind == "block":  # DeepSeek-style 128x128 fp32 block scales
            return weights + 4 * math.ceil(rows_in / 128) * math.ceil(cols_out / 128)
        if self.scale_kind == "tensor":
            return weights + 4
        if self.scale_kind == "gguf":
            return weights
        return rows_in * cols_out * self.dense_bytes


def weight_format(dtype_bytes: int, quantization: str | None, spec: ModelSpec) -> WeightFormat:
    """The storage format for `--quantization` (or the checkpoint's own quantization)."""
    method = (quantization or "").lower() or None
    if method is None:
        return WeightFormat(name=f"{dtype_bytes * 8}-bit", dense_bytes=dtype_bytes, bits=dtype_bytes * 8)
    if method == "mxfp4":  # gpt-oss's: the routed experts 4-bit with an 8-bit exponent per 32, all else dense
        return WeightFormat("mxfp4", dense_bytes=dtype_bytes, bits=dtype_bytes * 8, expert_bits=MXFP4_BITS)
    if method not in QUANT_METHODS:
        raise LlmctlError(f"unknown quantization {quantization!r}; choose one of: {', '.join(QUANT_METHODS)}")
    stored = sizing_quantization(spec.quantization)
    own = stored if stored and stored.method == method else None
    if method in ("awq", "gptq"):
        bits = (own.bits if own and own.bits else 4)
        group = (own.group_size if own and own.group_size else 128)
        return WeightFormat(method, dense_bytes=2, bits=bits, group_size=max(group, 0), scale_kind="group")
    if method == "fp8":
        block = bool(own and own.details.get("weight_block_size"))
        return WeightFormat("fp8", dense_bytes=dtype_bytes, bits=8, scale_kind="block" if block else "tensor")
    return WeightFormat("int8", dense_bytes=dtype_bytes, bits=8, scale_kind="channel")


def mxfp4_split_problem(intermediate: int, tp: int) -> str | None:
    """Why llmctl cannot split MXFP4 experts of `intermediate` inputs over `tp` ranks — each rank takes whole
    32-input groups (llmctl.engine.layers.mxfp4_experts; vLLM pads instead) — or None."""
    if (intermediate // tp) % 32 == 0:
        return None
    return (f"MXFP4 experts split over {tp} tensor-parallel ranks give each {intermediate // tp} of their "
            f"{intermediate} inputs, not whole groups of 32 (--enable-expert-parallel holds them whole)")


@dataclass(frozen=True)
class RankTensors:
    """What one TP rank of one decoder layer stores."""

    linears: tuple[tuple[int, int], ...]  # (in, out) of each quantizable linear
    other_params: int  # norms, biases, router: kept in the dense dtype
    expert_linears: tuple[tuple[int, int], ...] = ()  # (in, out) of each routed expert's linear

    @property
    def linear_params(self) -> int:
        return sum(rows * cols for rows, cols in self.linears + self.expert_linears)


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    """K/V heads each TP rank holds: split when TP divides them, replicated when TP exceeds them."""
    return max(1, spec.attention.num_kv_heads // tp)


def padded_vocab_per_rank(vocab: int, tp: int) -> int:
    padded = math.ceil(vocab / VOCAB_PADDING) * VOCAB_PADDING
    return math.ceil(padded / tp)


def layer_rank_tensors(spec: ModelSpec, layer: int, tp: int, expert_ranks: int = 0) -> RankTensors:
    """One GPU's tensors of one layer; `expert_ranks` > 0: whole experts spread over that many ranks
    (expert parallelism: TP × DP, as vLLM spreads them), else every expert split by TP."""
    mixer = spec.mixer is not None and spec.recurrent is not None and layer in spec.recurrent.layers
    attends = spec.attends(layer)
    parts = [_mixer_rank_tensors(spec, tp)] if mixer else []  # Falcon-H1: a mixer and attention in each layer
    parts += [_attention_rank_tensors(spec, tp)] if attends else []
    parts += [_mlp_rank_tensors(spec, layer, tp, expert_ranks)] if spec.has_mlp(layer) else []
    norm_size = 2 * spec.hidden_size if spec.layout.norm == "layernorm" else spec.hidden_size
    norms = spec.layout.norms_per_layer * norm_size + (spec.attention.qk_norm_params if attends else 0)  # every rank
    return RankTensors(tuple(linear for part in parts for linear in part.linears),
                       sum(part.other_params for part in parts) + norms,
                       tuple(linear for part in parts for linear in part.expert_linears))


def _attention_rank_tensors(spec: ModelSpec, tp: int) -> RankTensors:
    att, h = spec.attention, spec.hidden_size
    heads = att.num_heads // tp
    if att.kind == "MLA":
        nope, rope, v = att.qk_nope_head_dim or 0, att.qk_rope_head_dim or 0, att.v_head_dim or 0
        kv_rank, q_rank = att.kv_lora_rank or 0, att.q_lora_rank or 0
        linears: list[tuple[int, int]] = []
        other = kv_rank  # kv_a_layernorm
        if q_rank:  # q_a_proj is replicated, q_b_proj column-parallel
            linears += [(h, q_rank), (q_rank, heads * (nope + rope))]
            other += q_rank
        else:
            linears.append((h, heads * (nope + rope)))
        linears += [(h, kv_rank + rope), (kv_rank, heads * (nope + v)), (heads * v, h)]
        return RankTensors(tuple(linears), other)
    kv = kv_heads_per_rank(spec, tp)
    q_out, kv_out = heads * att.head_dim, kv * att.head_dim
    other = (q_out + 2 * kv_out if spec.layout.qkv_bias else 0) + (h if spec.layout.o_bias else 0) + \
        (heads if att.sinks else 0)  # gpt-oss's sinks: one per head
    gate = q_out if att.output_gate else 0  # Qwen3-Next: q_proj gives a gate beside each query head
    return RankTensors(((h, q_out + gate + 2 * kv_out), (q_out, h)), other)


def _mixer_rank_tensors(spec: ModelSpec, tp: int) -> RankTensors:
    """A recurrent layer's rank (Mamba2, gated DeltaNet): its projections split by TP (as vLLM), the rest per head."""
    mixer = spec.mixer
    assert mixer is not None
    return RankTensors(mixer.rank_linears(tp), mixer.rank_other_params(tp))


def _dense_mlp(h: int, inter: int, gated: bool, bias: bool, tp: int) -> RankTensors:
    part = inter // tp
    up = (h, 2 * part) if gated else (h, part)
    other = ((2 * part if gated else part) + h) if bias else 0
    return RankTensors((up, (part, h)), other)


def _mlp_rank_tensors(spec: ModelSpec, layer: int, tp: int, expert_ranks: int) -> RankTensors:
    h, lay, moe = spec.hidden_size, spec.layout, spec.moe
    if moe is None or layer not in moe.moe_layers:
        return _dense_mlp(h, spec.intermediate_size, lay.gated_mlp, lay.mlp_bias, tp)
    width = moe.latent_size or h  # Nemotron-H's latent experts, projected in and out (on every rank)
    if expert_ranks:  # whole experts spread over the expert-parallel ranks
        expert = _dense_mlp(width, moe.expert_intermediate_size, lay.gated_mlp, moe.expert_biases, 1)
        copies = math.ceil(moe.num_experts / expert_ranks)
    else:  # every expert split by TP (gpt-oss: each rank keeps a whole down bias per expert)
        expert = _dense_mlp(width, moe.expert_intermediate_size, lay.gated_mlp, moe.expert_biases, tp)
        copies = moe.num_experts
    linears: tuple[tuple[int, int], ...] = ()
    if moe.latent_size:
        linears += ((h, width), (width, h))
    if moe.shared_expert_intermediate_size:
        linears += _dense_mlp(h, moe.shared_expert_intermediate_size, lay.gated_mlp, False, tp).linears
    router = (h + 1 if moe.expert_biases else h) * moe.num_experts  # never quantized
    latent_biases = h + width if moe.latent_size and lay.mlp_bias else 0
    return RankTensors(linears, router + (h if moe.shared_expert_gate else 0) + expert.other_params * copies
                       + latent_biases, expert.linears * copies)


@dataclass(frozen=True)
class StageWeights:
    """Weights on one GPU of one pipeline stage."""

    stage: int
    layers: range
    params: int  # logical parameters on the GPU
    linear_bytes: int  # decoder linears, in the chosen (possibly quantized) format
    other_bytes: int  # embeddings, LM head, norms, biases, routers

    @property
    def total_bytes(self) -> int:
        return self.linear_bytes + self.other_bytes


def vllm_pipeline_stages(num_layers: int, pp: int, partition: str | None = None) -> list[range]:
    """The layers of each stage as vLLM places them (vllm.distributed.utils.get_pp_indices): ⌊L/PP⌋
    each, the remainder one by one to the stages before the last; or, when given, the sizes of
    VLLM_PP_LAYER_PARTITION ("24,40"), which must be PP whole numbers adding up to L."""
    if partition is not None:
        return _ranges(_partition_sizes(partition, num_layers, pp))
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    return _ranges(sizes)


def _partition_sizes(partition: str, num_layers: int, pp: int) -> list[int]:
    try:
        sizes = [int(size) for size in partition.split(",")]
    except ValueError:
        raise LlmctlError(f"VLLM_PP_LAYER_PARTITION={partition!r} is not a list of layer counts: use e.g. "
                          f"'{num_layers - num_layers // 2},{num_layers // 2}'") from None
    if len(sizes) != pp:
        raise LlmctlError(f"VLLM_PP_LAYER_PARTITION={partition!r} has {len(sizes)} stages; the pipeline has {pp}")
    if sum(sizes) != num_layers:
        raise LlmctlError(f"VLLM_PP_LAYER_PARTITION={partition!r} adds up to {sum(sizes)} layers; the model has "
                          f"{num_layers}")
    return sizes


def split_layers(num_layers: int, pp: int, head_layers: float = 0.0) -> list[range]:
    """llmctl's own split: vLLM's, except that the last stage also runs the LM head, which counts as
    `head_layers` layers of work there (with 0, the same as vLLM's)."""
    if pp == 1:
        return [range(num_layers)]
    last = max(1, min(num_layers - (pp - 1), math.floor((num_layers + head_layers) / pp - head_layers)))
    rest = num_layers - last
    sizes = [rest // (pp - 1)] * (pp - 1) + [last]
    for i in range(2, rest % (pp - 1) + 2):
        sizes[-i] += 1
    return _ranges(sizes)


def _ranges(sizes: list[int]) -> list[range]:
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def lm_head_in_layers(spec: ModelSpec) -> float:
    """The LM head's matmul work per token, in decoder layers (SmolLM2-135M: 8; Llama-3-70B: 1.2)."""
    head = padded_vocab_per_rank(spec.vocab_size, 1) * (spec.layout.word_embed_proj_dim or spec.hidden_size)
    return head / layer_rank_tensors(spec, spec.num_layers - 1, 1).linear_params


def pipeline_stages(spec: ModelSpec, pp: int) -> list[range]:
    """The layers of each of llmctl's pipeline stages, balanced by work: a decode step is as slow as
    its slowest stage, and the last one also runs the LM head (vLLM's split: vllm_pipeline_stages)."""
    return split_layers(spec.num_layers, pp, lm_head_in_layers(spec))


def stage_weights(spec: ModelSpec, fmt: WeightFormat, tp: int, pp: int, expert_ranks: int = 0,
                  stages: list[range] | None = None) -> list[StageWeights]:
    """Each stage's weight bytes per GPU; `stages` default to llmctl's own split."""
    result = []
    for index, layers in enumerate(stages or pipeline_stages(spec, pp)):
        params = other = 0
        linear_bytes = 0.0
        for layer in layers:
            tensors = layer_rank_tensors(spec, layer, tp, expert_ranks)
            params += tensors.linear_params + tensors.other_params
            other += tensors.other_params
            linear_bytes += sum(fmt.linear_bytes(rows, cols) for rows, cols in tensors.linears) + \
                sum(fmt.expert_bytes(rows, cols) for rows, cols in tensors.expert_linears)
        tables, edge = _edge_params(spec, tp, first=index == 0, last=index == pp - 1)
        if index == 0 and spec.vision is not None:  # the image tower, whole on each first-stage rank, unquantized
            edge += spec.vision.held
        params += tables + edge
        other += edge
        table_bytes = tables * fmt.table_bits / 8 if fmt.table_bits else tables * fmt.dense_bytes
        result.append(StageWeights(index, layers, params, int(round(linear_bytes)),
                                   other * fmt.dense_bytes + int(round(table_bytes))))
    return result


def _edge_params(spec: ModelSpec, tp: int, *, first: bool, last: bool) -> tuple[int, int]:
    """Embedding on the first stage; final norm and LM head on the last. A tied head shares
    the embedding when both sit on one GPU; otherwise the last stage holds its own copy.
    Returns (the vocabulary tables' parameters, the rest)."""
    lay, h = spec.layout, spec.hidden_size
    norm_size = 2 * h if lay.norm == "layernorm" else h
    embed_dim = lay.word_embed_proj_dim or h
    table = padded_vocab_per_rank(spec.vocab_size, tp) * embed_dim
    params = tables = 0
    if first:
        tables += table
        params += spec.positional.learned_positions * h
        params += norm_size if lay.embedding_norm else 0
        params += embed_dim * h if lay.word_embed_proj_dim else 0  # project_in
    if last:
        params += norm_size if lay.final_norm else 0
        params += embed_dim * h if lay.word_embed_proj_dim else 0  # project_out
        if not (spec.tie_word_embeddings and first):
            tables += table
        if lay.lm_head_bias:
            params += padded_vocab_per_rank(spec.vocab_size, tp)
    return tables, params
