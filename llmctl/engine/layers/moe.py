"""Mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3): a router picks each token's
top-k experts, the tokens are grouped by expert with one sort, and each expert runs once on all of its tokens (one
GEMM for gate and up, one for down) — never a loop over tokens, never the experts a token did not pick.

Experts are stored stacked, as vLLM's FusedMoE holds them: w13 [E, 2 × I, H] (gate rows then up rows)
and w2 [E, H, I]. Tensor parallelism splits every expert's intermediate size like a dense MLP's; with
expert parallelism (`--enable-expert-parallel`) each TP rank holds E / TP whole experts instead. Either
way every rank has every token (attention's all-reduce leaves them replicated), computes what its
weights can, and one all-reduce after the experts sums the parts — vLLM's all-reduce form of EP.
On CUDA the experts run as two grouped-GEMM launches over the sorted pairs (llmctl.kernels.fused_moe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from llmctl.checkpoint.weights import CheckpointTensor
from llmctl.engine.distributed.expert_exchange import ExpertPlacement
from llmctl.engine.distributed.group import TPGroup
from llmctl.engine.layers import cpu_gemm
from llmctl.engine.layers.activation_quant import activation_args, quantized_tokens
from llmctl.engine.layers.activations import silu_and_mul
from llmctl.engine.layers.coded_experts import CodedExperts
from llmctl.engine.layers.linear import LoadError, Part

PackedPair = tuple["cpu_gemm.PackedWeight | None", "cpu_gemm.PackedWeight | None"]  # an expert's w13, w2


@dataclass(frozen=True)
class Routing:
    """How a family turns router logits into expert weights (transformers' order of operations)."""

    top_k: int
    renormalize: bool  # the top-k weights divided by their sum (Mixtral; Qwen with norm_topk_prob; DeepSeek-V3)
    scoring: str = "softmax"  # "softmax" over all experts, or "sigmoid" of each (DeepSeek-V3)
    num_groups: int = 1  # DeepSeek's group-limited routing: experts in n_group groups ...
    topk_groups: int = 1  # ... of which each token picks from the topk_group best
    group_score: str = "max"  # a group's score: its best expert ("max", V2) or its best two summed ("top2", V3)
    scaling: float = 1.0  # routed_scaling_factor: the weights × this


def route(logits: torch.Tensor, routing: Routing, correction_bias: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores in float32 (softmax or sigmoid), top-k of the scores (plus DeepSeek-V3's correction bias, which
    chooses but does not weigh) within the best groups: weights [T, k] float32 and expert ids [T, k]."""
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if routing.scoring == "softmax" else torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if routing.num_groups > 1:
        choice = _best_groups_only(choice, routing)
    ids = torch.topk(choice, routing.top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)  # DeepSeek-V3's guard; 0 for a sum near 1
    return weights * routing.scaling if routing.scaling != 1.0 else weights, ids


def _best_groups_only(choice: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Scores outside each token's topk_groups best groups set to -inf (transformers' DeepSeek routers)."""
    grouped = choice.view(choice.shape[0], routing.num_groups, -1)
    group_scores = grouped.max(dim=-1).values if routing.group_score == "max" else \
        grouped.topk(2, dim=-1)[0].sum(dim=-1)
    best = torch.topk(group_scores, routing.topk_groups, dim=-1)[1]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view_as(choice)


def dense_expert(w13: torch.Tensor, w2: torch.Tensor, packed: list[PackedPair] | None = None,
                 quantize: Callable[[torch.Tensor], torch.Tensor] | None = None
                 ) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """Local expert i's MLP from the stacked weights; `packed`: each expert's weights packed for the CPU GEMMs
    (llmctl.engine.layers.cpu_gemm), as the dense linears are; `quantize`: what each projection's input goes
    through first (a W8A8 / FP8-dynamic checkpoint's per-token scheme), else nothing."""
    intermediate = w2.shape[2]
    same = quantize or (lambda t: t)

    def project(expert: int, chunk: torch.Tensor) -> torch.Tensor:
        pair = packed[expert] if packed else (None, None)
        gated = silu_and_mul(cpu_gemm.linear(same(chunk), w13[expert], pair[0]), intermediate)
        return cpu_gemm.linear(same(gated), w2[expert], pair[1])
    return project


def grouped_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, num_local: int,
                    project: Callable[[int, torch.Tensor], torch.Tensor], first_expert: int = 0,
                    scale_inputs: bool = False) -> torch.Tensor:
    """Σ_k weight_k · expert_k(x) for each token: [T, H] -> [T, H], over the `num_local` experts this rank holds
    (local expert i is expert first_expert + i, `project(i, tokens)` its MLP): a partial sum under TP or EP.
    `scale_inputs`: Σ_k expert_k(weight_k · x) instead (Llama 4)."""
    tokens, top_k = ids.shape
    local = ids.flatten() - first_expert
    pairs = ((local >= 0) & (local < num_local)).nonzero().squeeze(1)  # expert parallel: experts held here
    order = pairs[torch.argsort(local[pairs], stable=True)]  # (token, k) pairs grouped by expert
    counts = torch.bincount(local[pairs], minlength=num_local).tolist()
    rows = order // top_k
    gathered = x.index_select(0, rows)
    scale = weights.flatten().index_select(0, order)
    out = torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        weight = scale[start:start + count, None]
        if scale_inputs:
            y = project(expert, (gathered[start:start + count].float() * weight).to(x.dtype))
            out.index_add_(0, rows[start:start + count], y.float())
        else:
            y = project(expert, gathered[start:start + count])
            out.index_add_(0, rows[start:start + count], y.float() * weight)
        start += count
    return out.to(x.dtype)


class FusedMoE(nn.Module):
    """The routed experts of one layer: `load` takes transformers' per-expert gate/up/down tensors."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, routing: Routing, group: TPGroup,
                 experts: ExpertPlacement | None = None, coded: str | None = None,
                 activations: dict[str, Any] | None = None, stacked_weights: bool = True) -> None:
        """`activations`: a dynamic per-token scheme (compressed-tensors' input_activations) every expert
        projection's input is quantized by first, as in the checkpoint's own linears (W8A8, FP8-dynamic);
        `stacked_weights` False: a subclass holds the weights in a form of its own (the stacked tensors empty)."""
        super().__init__()
        self.activation_args = activation_args(activations) if activations else None
        # expert parallel: whole experts [first, first + local); else a slice of every expert
        self.part = Part(intermediate, 0, intermediate) if experts else Part.split(intermediate, group)
        local = num_experts // experts.size if experts else num_experts
        self.first_expert = experts.rank * local if experts else 0
        self.local_experts = range(self.first_expert, self.first_expert + local)
        self.num_experts, self.routing, self.group = num_experts, routing, group
        self.exchange = experts.exchange if experts else None  # EP across data-parallel replicas
        # coded (a CPU with whole experts; GPTQ, AWQ or GGUF, the method): the experts as codes, the stacked
        # tensors empty
        self.coded = CodedExperts(self.local_experts, intermediate, coded) if coded else None
        stacked = local if stacked_weights and not coded else 0
        self.w13 = nn.Parameter(torch.empty(stacked, 2 * self.part.size, hidden), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(stacked, hidden, self.part.size), requires_grad=False)
        self.packed_experts: list[PackedPair] | None = None  # CPU: set by cpu_gemm.pack_linears

    def expert_weights(self) -> list[torch.Tensor]:
        """Each local expert's gate/up [2I, H] and down [H, I], for cpu_gemm.pack_linears to pack."""
        return [w for expert in range(self.w13.shape[0]) for w in (self.w13[expert], self.w2[expert])]

    def holds(self, expert: int) -> bool:
        return expert in self.local_experts

    def expected(self) -> set[tuple[str, int]]:
        if self.coded is not None:
            return self.coded.expected()
        return {("w13", 2 * e + slot) for e in self.local_experts for slot in (0, 1)} | \
            {("w2", e) for e in self.local_experts}

    @property
    def nbytes(self) -> int:
        """The coded experts' bytes (stacked ones are parameters, counted as such)."""
        return self.coded.nbytes if self.coded is not None else 0

    def finish_loading(self) -> None:
        if self.coded is not None:
            self.coded.finish_loading()

    def load(self, kind: str, tensor: CheckpointTensor, part: int, offset: int | None = None) -> None:
        """w13 part 2e / 2e + 1: expert e's gate / up [I, H]; w2 part e: its down [H, I] (coded: their codes,
        scales and offsets, kinds w13_codes, ...)."""
        if self.coded is not None:
            self.coded.load(kind, tensor, part)
            return
        p = self.part
        dim = 0 if kind == "w13" else 1
        if tensor.shape[dim] != p.total:
            raise LoadError(f"{tensor.name}: checkpoint shape {tensor.shape}, expected {p.total} along dim {dim}")
        with torch.no_grad():
            if kind == "w13":
                expert, slot = divmod(part, 2)
                rows = self.w13[expert - self.first_expert, slot * p.size:(slot + 1) * p.size]
                rows.copy_(tensor.read(0, p.start, p.start + p.size))
            else:
                self.w2[part - self.first_expert].copy_(tensor.read(1, p.start, p.start + p.size))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: torch.Tensor | None = None) -> torch.Tensor:
        run = lambda tokens, logits: self._own_experts(tokens, logits, correction_bias)  # noqa: E731
        if self.exchange is not None and self.exchange.active:  # every replica's tokens meet every expert
            return self.exchange.combine(x, router_logits, run)
        return self.group.all_reduce(run(x, router_logits))

    def _quantized(self, x: torch.Tensor) -> torch.Tensor:
        return quantized_tokens(x, self.activation_args, self)

    def lend(self) -> None:
        """A replica with no batch of its own: its experts still serve the other replicas' tokens."""
        empty = self.w13.new_empty(0, self.w13.shape[2])
        self.forward(empty, torch.empty(0, self.num_experts, device=empty.device))

    def _own_experts(self, x: torch.Tensor, router_logits: torch.Tensor,
                     correction_bias: torch.Tensor | None) -> torch.Tensor:
        """This rank's experts' share of every token's output (zero for tokens routed elsewhere)."""
        weights, ids = route(router_logits, self.routing, correction_bias)
        quantize = self._quantized if self.activation_args is not None else None
        if x.is_cuda:  # one grouped GEMM launch per projection (llmctl.kernels.fused_moe)
            from llmctl.kernels.fused_moe import fused_moe

            return fused_moe(x, weights, ids, self.w13, self.w2, self.first_expert, quantize)
        project = self.coded.project if self.coded is not None else \
            dense_expert(self.w13, self.w2, self.packed_experts, quantize)
        return grouped_experts(x, weights, ids, len(self.local_experts), project, self.first_expert)
