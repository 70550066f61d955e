"""Linears and embeddings whose weights stay as integer codes on a CPU (GGUF blocks, GPTQ/AWQ repacked).

A `CodedWeight` is w[n, k] = code · scale[n, g] + offset[n, g] per group g along k: 4-bit codes packed
two to a byte in GGUF's Q4 order (the C++ `int4_linear`), or signed bytes (`int8_linear`). For few
input rows (decoding) the kernels decode the codes as they multiply; for many (prompts) the weight is
decoded once into float32 for one float GEMM, which is faster there (benchmarks/cpu_int4.py) — except for
4-bit GGUF codes with int8 activations where the int8 dot products win at every size (`integer_prompts`).
GGUF weights multiply int8 activations when decoding (`int8_activations`, the C++ `q8_linear`): x is
rounded to llama.cpp's Q8_0 blocks and the dot products are integer, as llama.cpp and vLLM's GGUF kernels
do; GPTQ/AWQ weights multiply float activations, as vLLM's kernels for them do. A compressed-tensors W8A8
checkpoint's int8 weights multiply x quantized per token as its scheme says (`per_token_activations`,
q8_linear's per_token mode), their per-channel scales repeated over 32-wide groups, at every number of rows
(prompts too: faster here than decoding the weight for a float GEMM, 14 against 21-23 ms for 512 rows of the
default model's MLP shapes).
`CodedLinear` holds one, or a float weight where a checkpoint stored one (a GGUF type llmctl does not
keep coded); the parts of a fused layer (q/k/v, gate/up) that came in different widths are widened to
the common one, which is exact: 4-bit codes fit a byte and a group splits into smaller ones.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from llmctl.engine.layers.activation_quant import activation_args, int8_per_token, quantized_tokens
from llmctl.errors import SettingError
from llmctl.kernels import cpu as cpu_kernels

DECODE_ROWS = 128  # input rows from which the weight is decoded once for one float GEMM (unless integer_prompts)
INTEGER_PROMPT_MIN_IN_FEATURES = 2048  # without VNNI, q8_linear beats decode + float GEMM from here (see below)
GGUF_ACTIVATIONS_ENV = "LLMCTL_GGUF_ACTIVATIONS"
CODED_KINDS = ("codes", "scales", "offsets")


@dataclass
class CodedWeight:
    codes: torch.Tensor  # uint8 [N, K / 2] (bits 4) or int8 [N, K] (bits 8)
    scales: torch.Tensor  # float32 [N, G], or float16 where that is exact (`compact`)
    offsets: torch.Tensor  # as scales
    int8_activations: bool = False  # decode with x rounded to int8 blocks (GGUF's numerics)
    offsets_used: bool = True  # False when every offset is 0 (Q8_0): the int8 kernel skips them
    per_token_activations: bool = False  # decode with x quantized per token (a W8A8 checkpoint's scheme)

    @staticmethod
    def compact(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor,
                int8_activations: bool = False) -> CodedWeight:
        """Scales and offsets in float16 when that holds every one exactly (GGUF stores Q4_0, Q4_1, Q5_0,
        Q5_1 and Q8_0's in float16): a decode reads 4 bytes per group for them instead of 8."""
        # copies, not views of the checkpoint's memory map: the map (every page of it read while loading) is
        # released once loading ends, where views kept all of it resident (110 MiB for the default model)
        scales, offsets = scales.float().clone(), offsets.float().clone()
        halves = scales.half(), offsets.half()
        if all(torch.equal(half.float(), full) for half, full in zip(halves, (scales, offsets))):
            scales, offsets = halves
        return CodedWeight(codes.clone(memory_format=torch.contiguous_format), scales, offsets, int8_activations,
                           bool(offsets.any()))

    def like(self, codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> CodedWeight:
        """Other codes, scales and offsets with this weight's activations and offset use."""
        return CodedWeight(codes, scales, offsets, self.int8_activations, self.offsets_used,
                           self.per_token_activations)

    @property
    def bits(self) -> int:
        return 4 if self.codes.dtype == torch.uint8 else 8

    @property
    def in_features(self) -> int:
        return self.codes.shape[1] * (2 if self.bits == 4 else 1)

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[1]

    @property
    def int8_kernel(self) -> bool:
        """Whether matmul multiplies int8 activations (q8_linear): GGUF codes in 32-wide groups, or 16-wide ones
        with 8-bit codes (Q6_K, and parts widened to sit beside it in a fused layer)."""
        return self.int8_activations and (self.group_size == 32 or (self.group_size == 16 and self.bits == 8))

    @property
    def per_token_kernel(self) -> bool:
        """Whether matmul multiplies int8 activations quantized per token (q8_linear's per_token mode)."""
        return self.per_token_activations and self.group_size == 32

    @property
    def integer_prompts(self) -> bool:
        """Whether prompts too go through q8_linear rather than a decoded float copy: W8A8 checkpoints (their
        scheme), and 4-bit GGUF codes with int8 activations on AVX-512 VNNI, or without it from 2048 inputs.
        q8 / float time on 2 Zen 4 cores, 128 and 512 rows (benchmarks/q8_prompt_rows.py): with VNNI 0.33–0.89
        on every shape from 576 to 8192 inputs; held to AVX2 0.47–0.98 from 2048 inputs, 1.2–1.6 at 576 (the
        default model's). 8-bit codes (Q6_K, Q8_0) stay on the float GEMM for prompts (q8 took 0.6–1.7× its
        time). No float copy also means no transient weight-sized buffers while a prompt runs."""
        if self.per_token_kernel:
            return True
        return self.int8_kernel and self.bits == 4 and (self.in_features >= INTEGER_PROMPT_MIN_IN_FEATURES or
                                                        _q8_vnni())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offsets))

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x Wᵀ + b for float32 x [M, K]."""
        if x.shape[0] >= DECODE_ROWS and not self.integer_prompts:
            return F.linear(x, self.dequantize(), bias)
        if self.int8_kernel or self.per_token_kernel:
            return cpu_kernels.q8_linear(x, self.codes, self.scales, self.offsets, bias,
                                         offsets_used=self.offsets_used, per_token=self.per_token_kernel)
        kernel = cpu_kernels.int4_linear if self.bits == 4 else cpu_kernels.int8_linear
        return kernel(x, self.codes, self.scales, self.offsets, bias)

    def dequantize(self) -> torch.Tensor:
        kernel = cpu_kernels.int4_dequantize if self.bits == 4 else cpu_kernels.int8_dequantize
        return kernel(self.codes, self.scales, self.offsets)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows `ids` of the weight (an embedding lookup)."""
        picked = self.like(self.codes.index_select(0, ids), self.scales.index_select(0, ids),
                           self.offsets.index_select(0, ids))
        return picked.dequantize()

    def widened(self, bits: int, group_size: int) -> CodedWeight:
        """The same weight with `bits`-wide codes and groups of `group_size` (a divisor of this one's)."""
        codes = self.codes
        if bits == 8 and self.bits == 4:
            chunks = codes.reshape(codes.shape[0], -1, 1, 16)
            codes = torch.cat([chunks & 0xF, chunks >> 4], dim=2).reshape(codes.shape[0], -1).to(torch.int8)
        repeat = self.group_size // group_size
        return self.like(codes.contiguous(), self.scales.repeat_interleave(repeat, dim=1).contiguous(),
                         self.offsets.repeat_interleave(repeat, dim=1).contiguous())

    @staticmethod
    def stacked(parts: list[CodedWeight]) -> CodedWeight:
        """Parts concatenated along the outputs, in the widest codes and the smallest groups among them."""
        bits, group = max(p.bits for p in parts), min(p.group_size for p in parts)
        if any(p.group_size % group for p in parts):
            raise ValueError(f"groups of {sorted({p.group_size for p in parts})} weights cannot share one layer")
        same = [p.widened(bits, group) if (p.bits, p.group_size) != (bits, group) else p for p in parts]
        if len(same) == 1:
            return same[0]
        joined = CodedWeight(*(torch.cat([getattr(p, name) for p in same]).contiguous()
                               for name in ("codes", "scales", "offsets")))
        joined.int8_activations = all(p.int8_activations for p in same)
        joined.offsets_used = any(p.offsets_used for p in same)
        return joined


@functools.cache
def _q8_vnni() -> bool:
    return cpu_kernels.q8_vnni()


def gguf_int8_activations() -> bool:
    """LLMCTL_GGUF_ACTIVATIONS: int8 (the default, llama.cpp's numerics) or float32 (exact against the
    dequantized model, slower decoding)."""
    choice = os.environ.get(GGUF_ACTIVATIONS_ENV, "int8")
    if choice not in ("int8", "float32"):
        raise SettingError(f"{GGUF_ACTIVATIONS_ENV}={choice!r}: use int8 or float32")
    return choice == "int8"


def coded_from(tensors: dict[str, torch.Tensor], int8_activations: bool | None = None) -> CodedWeight:
    """A tensor's codes: a GGUF tensor's decoded with int8 activations, as llama.cpp does (unless the
    environment asks for float32 ones); `int8_activations` False for other checkpoints' int8 weights."""
    chosen = gguf_int8_activations() if int8_activations is None else int8_activations
    return CodedWeight.compact(tensors["codes"], tensors["scales"], tensors["offsets"], int8_activations=chosen)


class CodedLinear(nn.Module):
    """A linear whose weight a GGUF checkpoint stored as codes (or, for types not kept coded, as floats), or
    a compressed-tensors checkpoint as 8-bit integers (`int8_activations` False: float activations, each
    token quantized first when the scheme quantizes activations, `activations`; for the int8 per-token scheme,
    q8_linear quantizes them and multiplies in integers)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, int8_activations: bool | None = None,
                 activations: dict | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.coded: CodedWeight | None = None
        self.weight: nn.Parameter | None = None  # only when a part came as floats
        self.int8_activations = int8_activations
        self.activation_args = activation_args(activations) if activations else None

    def load_parts(self, parts: list[dict[str, torch.Tensor]]) -> None:
        """Each part holds either `weight` or `codes`, `scales` and `offsets` (its rows of the outputs)."""
        if all("codes" in part for part in parts):
            self.coded = CodedWeight.stacked([coded_from(part, self.int8_activations) for part in parts])
            if self.coded.in_features != self.in_features:
                raise ValueError(f"codes of {self.coded.in_features} inputs, expected {self.in_features}")
            if self._integer_w8a8(self.coded):
                self.coded = self.coded.widened(8, 32)
                self.coded.per_token_activations = True
            return
        floats = [part["weight"].float() if "weight" in part else coded_from(part, False).dequantize()
                  for part in parts]
        self.weight = nn.Parameter(torch.cat(floats), requires_grad=False)

    def _integer_w8a8(self, coded: CodedWeight) -> bool:
        """Int8 weights (symmetric: no offsets) of the int8 per-token scheme, whose decode steps q8_linear takes
        in integers once their groups are 32 wide (a per-channel scale repeats exactly)."""
        return self.activation_args is not None and int8_per_token(self.activation_args) and coded.bits == 8 \
            and not coded.offsets_used and coded.group_size % 32 == 0

    @property
    def nbytes(self) -> int:
        return self.coded.nbytes if self.coded is not None else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        on_cpu = x.device.type == "cpu" and x.dtype == torch.float32
        integer = on_cpu and self.coded is not None and self.coded.per_token_kernel  # q8_linear quantizes x
        if self.activation_args is not None and not integer:
            x = quantized_tokens(x, self.activation_args, self)
        if self.coded is not None and on_cpu:
            flat = x.reshape(-1, self.in_features).contiguous()
            return self.coded.matmul(flat, self.bias).view(*x.shape[:-1], self.out_features)
        weight = self.weight if self.coded is None else self.coded.dequantize()
        return F.linear(x, weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


def coded_summary(model: nn.Module) -> str | None:
    """"12 4-bit and 3 8-bit coded weights (0.07 GiB), avx512 kernels[ with int8 activations as llama.cpp]",
    or None when there are none."""
    weights = [w for m in model.modules() for w in _coded_weights(getattr(m, "coded", None))]
    if not weights:
        return None
    by_bits = {bits: sum(1 for w in weights if w.bits == bits) for bits in (4, 8)}
    counts = " and ".join(f"{n} {bits}-bit" for bits, n in by_bits.items() if n)
    size = sum(w.nbytes for w in weights) / 2**30
    activations = " with int8 activations as llama.cpp" if any(w.int8_activations for w in weights) else \
        " with int8 activations per token (W8A8)" if any(w.per_token_activations for w in weights) else ""
    return f"{counts} coded weights ({size:.2f} GiB), {cpu_kernels.int4_isas()[0]} kernels{activations}"


def _coded_weights(held: object) -> list[CodedWeight]:
    """A module's coded weight, or those of its coded experts (llmctl.engine.layers.coded_experts)."""
    if isinstance(held, CodedWeight):
        return [held]
    return [w for w in getattr(held, "w13", []) + getattr(held, "w2", []) if isinstance(w, CodedWeight)]
