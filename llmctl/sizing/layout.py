"""Which TP × PP layouts a model allows, by vLLM's rules (heads, KV heads, layers, intermediate sizes, experts,
quantization groups): asked by `plan` for every layout and by the engine before any rank starts."""

from __future__ import annotations

from llmctl.checkpoint.spec import ModelSpec
from llmctl.sizing.weights import WeightFormat


def structural_problems(spec: ModelSpec, fmt: WeightFormat, tp: int, pp: int, gpus_per_node: int,
                        expert_ranks: int = 0, expert_parallel: bool = False) -> list[str]:
    """Why vLLM would refuse this layout before looking at memory (`expert_ranks`: the ranks experts spread
    over with expert parallelism, 0 without)."""
    att, problems = spec.attention, []
    if att.num_heads % tp:
        problems.append(f"{att.num_heads} attention heads are not divisible by TP {tp}")
    kv = att.num_kv_heads
    if att.kind != "MLA" and kv and (tp % kv if tp > kv else kv % tp):
        problems.append(f"{kv} KV heads cannot be split or replicated evenly over TP {tp}")
    if pp > spec.num_layers:
        problems.append(f"PP {pp} exceeds the {spec.num_layers} layers")
    if tp > gpus_per_node:
        problems.append(f"TP {tp} would cross nodes ({gpus_per_node} GPUs per node): keep TP inside a node "
                        "and use PP across nodes")
    mixer_problem = spec.mixer.tp_problem(tp) if spec.mixer is not None else None
    if mixer_problem:
        problems.append(mixer_problem)
    moe = spec.moe
    if spec.intermediate_size and spec.intermediate_size % tp and not (moe and not moe.dense_layers):
        problems.append(f"intermediate size {spec.intermediate_size} is not divisible by TP {tp}")
    ep = expert_ranks
    if moe and ep and moe.num_experts % ep:
        problems.append(f"{moe.num_experts} experts cannot be spread evenly over {ep} expert-parallel ranks"
                        + (f" (TP {tp} × {ep // tp} replicas)" if ep > tp else ""))
    if moe and not expert_parallel and moe.expert_intermediate_size % tp:
        problems.append(f"expert intermediate size {moe.expert_intermediate_size} is not divisible by TP {tp} "
                        "(try --enable-expert-parallel)")
    if fmt.scale_kind == "group" and fmt.group_size > 0:
        problems += _group_alignment_problems(spec, fmt.group_size, tp, expert_parallel)
    return problems


def _group_alignment_problems(spec: ModelSpec, group: int, tp: int, expert_parallel: bool) -> list[str]:
    inputs = {"hidden size": spec.hidden_size}
    att = spec.attention
    if att.kind != "MLA" and tp > 1:  # o_proj's input columns are split by TP
        q_size = att.num_heads * att.head_dim
        inputs[f"attention output / TP ({q_size} / {tp})"] = q_size // tp
    moe = spec.moe
    if not moe or moe.dense_layers:
        inputs[f"intermediate size / TP ({spec.intermediate_size} / {tp})"] = spec.intermediate_size // tp
    if moe:
        part = moe.expert_intermediate_size // (1 if expert_parallel else tp)
        inputs[f"expert intermediate size / TP ({moe.expert_intermediate_size} / {tp})"] = part
    return [f"{name} {size} is not a multiple of the quantization group size {group}"
            for name, size in inputs.items() if size % group]
