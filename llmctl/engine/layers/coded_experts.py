"""A mixture-of-experts layer's routed experts kept as codes on a CPU (GPTQ and AWQ Mixtral, Qwen-MoE and DeepSeek
checkpoints, GGUF files of Mixtral and Qwen-MoE), each expert's gate/up and down run on the coded kernels as the
checkpoint's dense layers are (llmctl.engine.layers.coded_linear), where dequantizing them at load would hold
every expert in float32: 32 bits a weight instead of ~4.5.

Each expert projection arrives as `codes` (packed as GGUF's coded form stores them), `scales` and `offsets` per
group (llmctl.checkpoint.quant_converters.ExpertsToCodes, llmctl.checkpoint.gguf_convert); one that cannot be
kept coded (act-order GPTQ, groups not a multiple of 32, a GGUF type not kept coded) arrives as a dequantized
`weight` and runs as floats. GGUF's multiply int8 activations as llama.cpp does (unless LLMCTL_GGUF_ACTIVATIONS
says float32), GPTQ/AWQ's float ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llmctl.checkpoint.architecture import QuantizationSpec
from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.coded_linear import CodedWeight, coded_from

CODED_FIELDS = ("codes", "scales", "offsets")
ExpertWeight = CodedWeight | torch.Tensor


def coded_experts_method(quant: QuantizationSpec | None) -> str | None:
    """The method whose experts a layer form keeps coded (details {"experts": "codes"}), else None."""
    return quant.method if quant is not None and quant.details.get("experts") == "codes" else None


class CodedExperts:
    """The local experts' projections: gate and up joined (w13), down (w2), as codes or floats."""

    def __init__(self, local_experts: range, intermediate: int, method: str) -> None:
        self.local_experts, self.intermediate = local_experts, intermediate
        self.int8_activations = None if method == "gguf" else False  # None: GGUF's setting (coded_from)
        self.pending: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.arrived: dict[tuple[str, int], set[str]] = {}  # kept after loading, for `expected`
        self.w13: list[ExpertWeight] = []
        self.w2: list[ExpertWeight] = []

    def load(self, kind: str, tensor: CheckpointTensor, part: int) -> None:
        """kind: w13 / w2 (a dequantized `weight`), or w13_codes, w2_scales, ... (part: as FusedMoE.load's)."""
        stacked, _, field = kind.partition("_")
        self.pending.setdefault((stacked, part), {})[field or "weight"] = tensor.read()
        self.arrived.setdefault((stacked, part), set()).add(field or "weight")

    def expected(self) -> set[tuple[str, int]]:
        """Every part's codes, scales and offsets where its codes came, else its weight."""
        parts = [("w13", 2 * e + slot) for e in self.local_experts for slot in (0, 1)] + \
            [("w2", e) for e in self.local_experts]
        kinds: set[tuple[str, int]] = set()
        for stacked, part in parts:
            coded = "codes" in self.arrived.get((stacked, part), set())
            kinds |= {(f"{stacked}_{field}", part) for field in CODED_FIELDS} if coded else {(stacked, part)}
        return kinds

    def finish_loading(self) -> None:
        for expert in self.local_experts:
            self.w13.append(_joined([self._part("w13", 2 * expert), self._part("w13", 2 * expert + 1)]))
            self.w2.append(self._part("w2", expert))
        self.pending = {}

    def _part(self, stacked: str, part: int) -> ExpertWeight:
        fields = self.pending[(stacked, part)]
        if "codes" not in fields:
            return fields["weight"].float()
        return coded_from(fields, self.int8_activations)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes if isinstance(w, CodedWeight) else w.numel() * w.element_size()
                   for w in self.w13 + self.w2)

    def project(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """Local expert `expert`'s MLP of its tokens x [n, H]."""
        return _matmul(self.w2[expert], silu_and_mul(_matmul(self.w13[expert], x), self.intermediate))


def _joined(parts: list[ExpertWeight]) -> ExpertWeight:
    """Gate and up as one weight: codes stacked where both are codes, else floats."""
    if all(isinstance(part, CodedWeight) for part in parts):
        return CodedWeight.stacked(parts)  # type: ignore[arg-type]
    return torch.cat([part.dequantize() if isinstance(part, CodedWeight) else part for part in parts])


def _matmul(weight: ExpertWeight, x: torch.Tensor) -> torch.Tensor:
    if isinstance(weight, CodedWeight):
        return weight.matmul(x.float().contiguous()).to(x.dtype)
    return F.linear(x, weight.to(x.dtype))
