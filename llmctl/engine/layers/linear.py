"""Tensor-parallel linear layers and embeddings, sharded as vLLM shards them.

Column-parallel layers (QKV, gate/up, fc1) keep a slice of the output rows; row-parallel
layers (o, down, fc2) keep a slice of the input columns, sum their partial products with
one all-reduce and add the bias once, after it. The vocabulary is padded to a multiple of
64 and split evenly, for the embedding and the LM head alike. Every layer loads from
`CheckpointTensor`s, reading only its own rows or columns. With TP 1 they are plain
linears, so the single-process engine runs the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.checkpoint.quant_formats import packed_shard_range
from llmctl.checkpoint.spec import QuantizationSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.activation_quant import ActivationQuantLinear
from llmctl.engine.layers.coded_linear import CODED_KINDS, CodedLinear, CodedWeight, coded_from
from llmctl.engine.layers.quant_linear import QuantLinear
from llmctl.sizing.weights import padded_vocab_per_rank

if TYPE_CHECKING:
    from llmctl.engine.lora.slots import LoRASlots

PACKED = ("qweight", "qzeros", "scales", "g_idx")


@dataclass(frozen=True)
class Part:
    """A rank's rows [start, start + size) of one logical part (q, k, v, gate, up) of `total` rows."""

    total: int
    start: int
    size: int

    @staticmethod
    def split(total: int, group: TPGroup) -> Part:
        size = total // group.size
        return Part(total, group.rank * size, size)

    @staticmethod
    def kv_heads(num_kv_heads: int, head_dim: int, group: TPGroup) -> Part:
        """K or V: split by head when TP divides the KV heads, else one replicated head per rank."""
        total = num_kv_heads * head_dim
        if num_kv_heads >= group.size:
            return Part.split(total, group)
        head = group.rank * num_kv_heads // group.size
        return Part(total, head * head_dim, head_dim)


class LoadError(ValueError):
    """A checkpoint tensor does not fit the layer (shape, or a quantized layout that cannot be split)."""


def _local_linear(in_features: int, out_features: int, bias: bool, quant: QuantizationSpec | None) -> nn.Module:
    if quant is not None and quant.method == "gguf":
        return CodedLinear(in_features, out_features, bias)
    if quant is not None and quant.method == "int8-codes":  # compressed-tensors int8 weights on a CPU
        return CodedLinear(in_features, out_features, bias, int8_activations=False,
                           activations=quant.details.get("input_activations"))
    if quant is not None and quant.method == "dynamic-activations":
        return ActivationQuantLinear(in_features, out_features, bias, quant.details["input_activations"])
    if quant is None or quant.method not in ("gptq", "awq", "fp8"):
        return nn.Linear(in_features, out_features, bias=bias)
    return QuantLinear(in_features, out_features, bias, quant.method, quant.bits or 4, quant.group_size or 128)


class ReadOnlyLinear(nn.Linear):
    """A linear whose weight is read, not multiplied (MLA's kv_b_proj, absorbed into the query and the
    output): cpu_gemm.pack_linears, which packs plain nn.Linear layers only, gives it no packed copy."""


def _check_rows(tensor: CheckpointTensor, dim: int, expected: int) -> None:
    if tensor.shape[dim] != expected:
        raise LoadError(f"{tensor.name}: checkpoint shape {tensor.shape}, expected {expected} along dim {dim}")


class ColumnParallelLinear(nn.Module):
    """y = x Wᵀ for this rank's output rows of one or more fused parts."""

    def __init__(self, in_features: int, parts: list[Part], bias: bool, quant: QuantizationSpec | None = None,
                 read_only: bool = False) -> None:
        """`read_only`: the weight is read by the model, never run as a linear (ReadOnlyLinear)."""
        super().__init__()
        self.parts = parts
        self.out_features = sum(p.size for p in parts)
        self.inner = ReadOnlyLinear(in_features, self.out_features, bias) if read_only else \
            _local_linear(in_features, self.out_features, bias, quant)
        self.lora: LoRASlots | None = None  # resident adapters' A/B (--enable-lora)
        self._pending: dict[int, dict[str, torch.Tensor]] = {}
        self._arrived: dict[int, set[str]] = {}  # a coded layer's kinds per part (weight, or codes/scales/offsets)

    def expected(self) -> set[tuple[str, int]]:
        bias = ("bias",) if self.inner.bias is not None else ()
        if isinstance(self.inner, CodedLinear):
            return {(kind, i) for i in range(len(self.parts)) for kind in _coded_kinds(self._arrived.get(i)) + bias}
        kinds = getattr(self.inner, "stored_kinds", ("weight",))  # a plain linear (packed or not): its weight
        return {(kind, i) for kind in kinds + bias for i in range(len(self.parts))}

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        """`tensor` holds part `part` (at row `offset` when several parts share one tensor)."""
        p = self.parts[part]
        begin = sum(q.size for q in self.parts[:part])
        if isinstance(self.inner, CodedLinear) and kind != "bias":
            start = (offset or 0) + p.start
            self._pending.setdefault(part, {})[kind] = tensor.read(0, start, start + p.size)
            self._arrived.setdefault(part, set()).add(kind)
            return
        if kind in PACKED:
            self._stash(kind, tensor, part, p, offset or 0)
            return
        fits = tensor.shape[0] == p.total if offset is None else tensor.shape[0] >= offset + p.total
        if not fits:
            raise LoadError(f"{tensor.name}: checkpoint shape {tensor.shape}, expected {p.total} rows")
        offset = offset or 0
        target = self.inner.weight if kind == "weight" else self.inner.bias
        with torch.no_grad():
            target[begin:begin + p.size].copy_(tensor.read(0, offset + p.start, offset + p.start + p.size))

    def _stash(self, kind: str, tensor: CheckpointTensor, part: int, p: Part, offset: int) -> None:
        """Packed tensors hold outputs as columns: a fused checkpoint tensor (Phi-3's qkv_proj) gives each
        part its columns from `offset` on, as a plain tensor gives rows."""
        inner = self.inner
        start = offset + p.start
        if start % inner.pack or p.size % inner.pack:
            raise LoadError(f"{tensor.name}: output rows {start}..{start + p.size} of this rank are not on "
                            f"{inner.pack}-column boundaries of the packed {inner.method.upper()} layout")
        where = packed_shard_range(inner.method, kind, "out", start, start + p.size, inner.bits,
                                   inner.group_size)
        self._pending.setdefault(part, {})[kind] = tensor.read(*where) if where else tensor.read()

    def finish_loading(self) -> None:
        if isinstance(self.inner, (QuantLinear, CodedLinear)):
            self.inner.load_parts([self._pending[i] for i in range(len(self.parts))])
            self._pending = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return y if self.lora is None else self.lora.add(x, y)


class RowParallelLinear(nn.Module):
    """y = all_reduce(x_rank W_rankᵀ) + b: this rank's input columns, the bias added once."""

    def __init__(self, part: Part, out_features: int, bias: bool, group: TPGroup,
                 quant: QuantizationSpec | None = None) -> None:
        super().__init__()
        self.part, self.group = part, group
        self.inner = _local_linear(part.size, out_features, False, quant)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.lora: LoRASlots | None = None  # added to this rank's partial sum: Σ (x_r A_rᵀ) B = (x Aᵀ) B
        self._pending: dict[str, torch.Tensor] = {}
        self._arrived: set[str] = set()  # a coded layer's kinds (weight, or codes/scales/offsets)

    def expected(self) -> set[tuple[str, int]]:
        kinds = _coded_kinds(self._arrived) if isinstance(self.inner, CodedLinear) else \
            getattr(self.inner, "stored_kinds", ("weight",))  # a plain linear (packed or not): its weight
        return {(kind, 0) for kind in kinds + (("bias",) if self.bias is not None else ())}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        p = self.part
        if kind == "bias":
            with torch.no_grad():
                self.bias.copy_(tensor.read())
        elif isinstance(self.inner, CodedLinear):
            self._pending[kind] = self._coded_columns(kind, tensor)
            self._arrived.add(kind)
        elif kind in PACKED:
            inner = self.inner
            if p.start % inner.group_size or p.size % inner.group_size:
                raise LoadError(f"{tensor.name}: input columns {p.start}..{p.start + p.size} of this rank are not "
                                f"on boundaries of the quantization groups ({inner.group_size})")
            read = tensor.read(*packed_shard_range(inner.method, kind, "in", p.start, p.start + p.size,
                                                   inner.bits, inner.group_size))
            if kind == "g_idx":
                read = self._local_g_idx(tensor.name, read)
            self._pending[kind] = read
        else:
            _check_rows(tensor, 1, p.total)
            with torch.no_grad():
                self.inner.weight.copy_(tensor.read(1, p.start, p.start + p.size))

    def _coded_columns(self, kind: str, tensor: CheckpointTensor) -> torch.Tensor:
        """This rank's input columns of a weight, codes (two to a byte when 4-bit), scales or offsets."""
        p = self.part
        per_column = tensor.shape[1] / p.total  # 1 for weight and int8 codes, 1/2 for 4-bit, 1/group for scales
        if p.size == p.total:
            return tensor.read()
        start, stop = p.start * per_column, (p.start + p.size) * per_column
        if start != int(start) or stop != int(stop) or (kind == "codes" and per_column < 1 and p.start % 32):
            raise LoadError(f"{tensor.name}: input columns {p.start}..{p.start + p.size} of this rank split a "
                            "quantization block; use a --tp that divides the blocks")
        return tensor.read(1, int(start), int(stop))

    def _local_g_idx(self, name: str, g_idx: torch.Tensor) -> torch.Tensor:
        """This rank's slice of g_idx, counted from its first group; act-order slices name groups all over
        the input, whose scales this rank does not hold."""
        first, group_size = self.part.start // self.inner.group_size, self.inner.group_size
        local = g_idx - first
        contiguous = torch.arange(self.part.size, dtype=local.dtype) // group_size
        if self.group.size > 1 and not torch.equal(local, contiguous):
            raise LoadError(f"{name}: act-order GPTQ (desc_act, a permuted g_idx) runs with --tp 1 only in "
                            "llmctl; use --tp 1 (with --pp or --dp to spread it), or a desc_act false checkpoint")
        return local

    def finish_loading(self) -> None:
        if isinstance(self.inner, (QuantLinear, CodedLinear)):
            self.inner.load_parts([self._pending])
            self._pending = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = self.inner(x)
        if self.lora is not None:
            partial = self.lora.add(x, partial)
        y = self.group.all_reduce(partial)
        return y if self.bias is None else y + self.bias


def _coded_kinds(arrived: set[str] | None) -> tuple[str, ...]:
    """A coded layer's part comes as a float weight or as codes, scales and offsets (codes until one arrives)."""
    return ("weight",) if arrived and "weight" in arrived else CODED_KINDS


class VocabParallelEmbedding(nn.Module):
    """This rank's rows of the (padded) vocabulary; tokens owned elsewhere give zeros, summed by all-reduce.
    A GGUF table stays coded (`coded`): lookups decode only the rows asked for, and the head runs the
    coded kernels."""

    def __init__(self, vocab_size: int, dim: int, group: TPGroup) -> None:
        super().__init__()
        self.vocab_size, self.group = vocab_size, group
        self.rows = padded_vocab_per_rank(vocab_size, group.size)
        self.start = group.rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, dim))  # not touched until loaded: a coded table stays 0 B
        self.packed_head: cpu_gemm.PackedWeight | None = None  # the LM head packed for CPU GEMMs (cpu_gemm)
        self.coded: CodedWeight | None = None
        self._pending: dict[str, torch.Tensor] = {}

    def expected(self) -> set[tuple[str, int]]:
        return {(kind, 0) for kind in CODED_KINDS} if self._pending or self.coded is not None else {("weight", 0)}

    def load(self, kind: str, tensor: CheckpointTensor, part: int = 0, offset: int | None = None) -> None:
        _check_rows(tensor, 0, self.vocab_size)
        stop = min(self.start + self.rows, self.vocab_size)
        if kind in CODED_KINDS:
            self._pending[kind] = tensor.read(0, self.start, max(stop, self.start))
            return
        with torch.no_grad():
            self.weight[max(stop - self.start, 0):].zero_()  # the padding rows
            if stop > self.start:
                self.weight[:stop - self.start].copy_(tensor.read(0, self.start, stop))

    def finish_loading(self) -> None:
        if self._pending:
            self.coded = coded_from(self._pending)
            self.weight = nn.Parameter(torch.empty(0, self.weight.shape[1]), requires_grad=False)
            self._pending = {}

    def decode_coded(self) -> None:
        """Run dequantized: the float32 table (padding rows zero) in place of the codes."""
        table = torch.zeros(self.rows, self.coded.in_features)
        table[:self.coded.codes.shape[0]] = self.coded.dequantize()
        self.weight, self.coded = nn.Parameter(table, requires_grad=False), None

    @property
    def nbytes(self) -> int:
        return self.coded.nbytes if self.coded is not None else 0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """As the LM head (tied or not): every rank gets [T, vocab]."""
        if self.coded is not None:
            flat = hidden.reshape(-1, hidden.shape[-1]).contiguous()
            local = self.coded.matmul(flat).view(*hidden.shape[:-1], -1)
            local = F.pad(local, (0, self.rows - local.shape[-1]))
        else:
            local = cpu_gemm.linear(hidden, self.weight, self.packed_head)
        return self.group.all_gather(local)[..., :self.vocab_size]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return self._lookup(ids)
        local = ids - self.start
        outside = (local < 0) | (local >= self.rows)
        out = self._lookup(local.masked_fill(outside, 0))
        return self.group.all_reduce(out.masked_fill(outside.unsqueeze(-1), 0))

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.coded is None:
            return F.embedding(ids, self.weight)
        flat = ids.reshape(-1).clamp(max=self.coded.codes.shape[0] - 1)
        return self.coded.rows(flat).view(*ids.shape, -1)
