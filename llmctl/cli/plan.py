"""`llmctl plan`: weights and KV per GPU for every TP × PP layout, before buying anything."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llmctl.cli.common import JsonOpt, ModelArg, RevisionOpt, parse_count
from llmctl.errors import LlmctlError
from llmctl.settings import DEFAULT_MAX_NUM_SEQS, KV_CACHE_FORMATS

if TYPE_CHECKING:
    from llmctl.checkpoint.source import ModelSource
    from llmctl.checkpoint.spec import ModelSpec

KV_HELP = f"{', '.join(KV_CACHE_FORMATS)} (vLLM's names, as llmctl serve takes them)"

ENFORCE_EAGER_HELP = ("pass --enforce-eager on to the vllm serve lines (vLLM captures CUDA graphs outside the "
                      "--gpu-memory-utilization budget, so the KV pool is the same)")


def plan(
    model: ModelArg = None,
    revision: RevisionOpt = None,
    gpus: Annotated[Optional[int], typer.Option("--gpus", help="GPUs in total (default: the GPUs of this machine, "
                                                              "else nodes × gpus-per-node, else 1)")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type, e.g. h100-80gb, a100-40gb, l4, mi300x "
                                                            "(default: this machine's, else h100-80gb)")] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="machines the GPUs are spread over")] = 1,
    gpus_per_node: Annotated[Optional[int], typer.Option("--gpus-per-node", help="GPUs in each node")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization",
                                                          help="fraction of each GPU's memory to use")] = 0.9,
    dtype: Annotated[str, typer.Option("--dtype", help="auto, bfloat16, float16, float32")] = "auto",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help=KV_HELP)] = "auto",
    quantization: Annotated[Optional[str], typer.Option("--quantization", "-q",
                                                        help="awq, gptq, fp8 or int8 weights")] = None,
    max_model_len: Annotated[Optional[str], typer.Option("--max-model-len", help="context per sequence (default: the "
                                                         "model's): tokens, or vLLM's 32k or 32K")] = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="sequences per step")] = DEFAULT_MAX_NUM_SEQS,
    max_num_batched_tokens: Annotated[int, typer.Option("--max-num-batched-tokens",
                                                        help="tokens per step (sizes activations)")] = 8192,
    tp: Annotated[Optional[int], typer.Option("--tensor-parallel-size", "--tp", "-tp", help="evaluate only this TP")] = None,
    pp: Annotated[Optional[int], typer.Option("--pipeline-parallel-size", "--pp", "-pp", help="evaluate only this PP")] = None,
    expert_parallel: Annotated[bool, typer.Option("--enable-expert-parallel",
                                                  help="MoE: whole experts per GPU instead of slices, spread over TP × DP GPUs (as vLLM)")] = False,
    enforce_eager: Annotated[bool, typer.Option("--enforce-eager", help=ENFORCE_EAGER_HELP)] = False,
    max_loras: Annotated[int, typer.Option(
        "--max-loras", help="count the memory of this many resident LoRA adapter slots (0: none)")] = 0,
    max_lora_rank: Annotated[int, typer.Option("--max-lora-rank", help="the rank of those slots")] = 16,
    min_concurrency: Annotated[float, typer.Option(
        "--min-concurrency", help="full-length sequences a replica must hold to be recommended")] = 1.0,
    as_json: JsonOpt = False,
) -> None:
    """Does it fit, on how many GPUs, with which TP/PP, and how many sequences will the KV cache hold?"""
    from llmctl.checkpoint.source import DEFAULT_MODEL_ID, resolve_model
    from llmctl.display import plan_to_dict, print_json, render_plan
    from llmctl.engine.models.registry import implementation
    from llmctl.plan.gguf_sizes import gguf_sizes
    from llmctl.plan.hardware import resolve_hardware
    from llmctl.plan.planner import PlanRequest, build_plan

    hardware = resolve_hardware(gpu, gpus, nodes, gpus_per_node)
    source = resolve_model(model, revision, show_progress=not as_json)
    spec, pooling = _as_served(source)
    impl, refusal = implementation(spec)
    request = PlanRequest(
        gpu=hardware.gpu, gpus=hardware.gpus, nodes=nodes, gpu_memory_utilization=gpu_memory_utilization,
        dtype=dtype, kv_cache_dtype=kv_cache_dtype, quantization=quantization,
        max_model_len=parse_count(max_model_len, "--max-model-len"), max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, tp=tp, pp=pp,
        expert_parallel=expert_parallel, enforce_eager=enforce_eager, min_concurrency=min_concurrency,
        max_loras=max_loras, max_lora_rank=max_lora_rank, llmctl_impl=impl, llmctl_refusal=refusal,
        pp_layer_partition=os.environ.get("VLLM_PP_LAYER_PARTITION"), pooling=pooling,  # as vLLM reads it
        gguf=gguf_sizes(source.gguf_path) if model and source.gguf_path else None,  # the default model: its hub bf16
    )
    result = build_plan(spec, request, model or DEFAULT_MODEL_ID)
    if as_json:
        print_json({**plan_to_dict(result), "gpu_note": hardware.note})
    else:
        render_plan(result, hardware.note)
    if result.recommended is None:
        raise typer.Exit(1)


def _as_served(source: ModelSource) -> tuple[ModelSpec, str | None]:
    """The spec as served, and what a pooling model pools (None for a generator): a pooling model loads no LM
    head of its own, so it is counted as one sharing the embedding table. A model with recurrent layers other than
    Mamba2 mixers is refused: plan does not size their state yet."""
    from llmctl.checkpoint.config_file import load_config, load_spec
    from llmctl.checkpoint.pooling import pooling_spec

    spec, pooling = load_spec(source), pooling_spec(source.path, load_config(source))
    if spec.recurrent is not None and spec.mixer is None:
        raise LlmctlError(f"plan does not size this model yet: {spec.recurrent.describe()}, which keep a "
                          "recurrent state per sequence, not K/V per token; plan's weights and KV cache would count "
                          "them as attention layers (vLLM sizes them with its hybrid allocator)")
    if pooling is None:
        return spec, None
    return dataclasses.replace(spec, tie_word_embeddings=True), pooling.describe()
