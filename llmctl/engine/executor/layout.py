"""Is a TP × PP layout possible for this model? Asked before any process starts, with
`llmctl plan`'s own rules (llmctl.sizing.layout.structural_problems), so both agree."""

from __future__ import annotations

import os

import torch

from llmctl.checkpoint.quant_schemes import sizing_quantization
from llmctl.checkpoint.spec import ModelSpec
from llmctl.engine.config import EngineConfig
from llmctl.engine.errors import EngineConfigError
from llmctl.sizing.layout import structural_problems
from llmctl.sizing.weights import weight_format


def layout_problems(spec: ModelSpec, tp: int, pp: int, expert_parallel: bool = False, dp: int = 1) -> list[str]:
    stored = sizing_quantization(spec.quantization)
    quant = stored.method if stored else None
    fmt = weight_format(2, quant, spec)
    ranks = tp * pp * dp  # on one node as far as layout goes: TP may use every rank
    return structural_problems(spec, fmt, tp, pp, gpus_per_node=ranks, expert_ranks=tp * dp if expert_parallel else 0,
                               expert_parallel=expert_parallel)


def check_layout(spec: ModelSpec, config: EngineConfig, device: str) -> None:
    """One line naming what is wrong and the sizes that work."""
    tp, pp, dp = config.tensor_parallel_size, config.pipeline_parallel_size, config.data_parallel_size
    ep = config.enable_expert_parallel
    if ep and spec.moe is None:
        raise EngineConfigError("--enable-expert-parallel applies to mixture-of-experts models; this model has no "
                                "experts: leave it out")
    replicas = dp if ep else 1  # with expert parallelism the experts spread over the replicas too
    problems = layout_problems(spec, tp, pp, ep, replicas)
    if problems:
        shown = f"--tp {tp} --pp {pp}" + (f" --dp {dp} --enable-expert-parallel" if replicas > 1 else "")
        raise EngineConfigError(f"{shown} cannot run this model: {'; '.join(problems)}. "
                                f"{_what_works(spec, tp, ep, replicas)}")
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        gpus = torch.cuda.device_count()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", tp * pp * dp))
        if local > gpus:
            raise EngineConfigError(f"--tp {tp} × --pp {pp} × --dp {dp} needs {local} GPUs on this machine and it "
                                    f"has {gpus}: use fewer ranks, or torchrun over several machines")


def check_expert_replicas(config: EngineConfig) -> None:
    """EP across data-parallel replicas: the experts must spread evenly over TP × DP ranks, one stage each."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    if config.pipeline_parallel_size > 1:
        raise EngineConfigError("--enable-expert-parallel with --dp > 1 spreads experts over the replicas, which "
                                "llmctl runs with one pipeline stage each: use --pp 1 (or --dp 1)")
    check_layout(load_spec(resolve_model(config.model, config.revision, weights=False)), config, config.device)


def _what_works(spec: ModelSpec, tp: int, ep: bool, replicas: int) -> str:
    if replicas > 1:
        working_dp = [d for d in range(1, 65) if not layout_problems(spec, tp, 1, ep, d)]
        return f"--dp sizes that work with --tp {tp}: {_sizes(working_dp)}"
    working_tp = [t for t in range(1, 65) if not layout_problems(spec, t, 1, ep)]
    working_pp = [p for p in range(1, min(spec.num_layers, 64) + 1) if not layout_problems(spec, 1, p)]
    return f"TP sizes that work: {_sizes(working_tp)}; PP sizes: {_sizes(working_pp)}"


def _sizes(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:12]) + (" …" if len(values) > 12 else "")

