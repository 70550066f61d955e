"""The notes under a plan: what the numbers assume, and what a reader should know about this model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmctl.checkpoint.quant_schemes import describe as describe_quantization
from llmctl.checkpoint.quant_schemes import served_form
from llmctl.checkpoint.spec import ModelSpec
from llmctl.sizing.lora import lora_slot_bytes
from llmctl.sizing.weights import WEIGHT_DTYPES, WeightFormat, lm_head_in_layers, pipeline_stages, vllm_pipeline_stages
from llmctl.units import GiB

if TYPE_CHECKING:
    from llmctl.plan.planner import Plan, PlanRequest


def _pipeline_notes(spec: ModelSpec, req: PlanRequest, plan: Plan) -> list[str]:
    """With PP, which split the numbers use (vLLM's) and how llmctl serve's own differs."""
    best = plan.recommended
    if best is None or best.pp == 1:
        return []
    vllm = [len(r) for r in vllm_pipeline_stages(spec.num_layers, best.pp, req.pp_layer_partition)]
    ours = [len(r) for r in pipeline_stages(spec, best.pp)]
    source = "VLLM_PP_LAYER_PARTITION" if req.pp_layer_partition else "vLLM's even split"
    note = f"PP stages hold {'/'.join(map(str, vllm))} layers ({source}), as the numbers above assume"
    if ours != vllm:
        note += (f"; llmctl serve splits them {'/'.join(map(str, ours))}: its last stage also runs the LM head, "
                 f"weighed as {lm_head_in_layers(spec):.1f} layers")
    return [note]


def plan_notes(spec: ModelSpec, req: PlanRequest, fmt: WeightFormat, plan: Plan) -> list[str]:
    notes = _pipeline_notes(spec, req, plan)
    if spec.moe:
        notes.append(f"MoE: {spec.moe.num_experts} experts, top-{spec.moe.top_k}; every expert's weights are "
                     "resident, only the active parameters are computed per token")
    if fmt.scale_kind == "gguf":
        notes.append(f"GGUF weights counted in their blocks, as vLLM keeps them: {fmt.bits:.2f} bits per weight in "
                     f"the layers, {fmt.table_bits:.2f} in the vocabulary tables; llmctl serve keeps them quantized on "
                     f"CPUs only and runs {plan.dtype} on GPUs")
    if spec.quantization is not None and not req.quantization and spec.quantization.method != "gguf":
        notes.append(f"{describe_quantization(spec.quantization)}: counted as stored, as vLLM holds it; "
                     f"{served_form(spec.quantization, plan.dtype, spec.moe is not None, spec.attention.kind == 'MLA')}")
    if fmt.name == "fp8" and not req.gpu.fp8:
        notes.append(f"{req.gpu.key} has no FP8 tensor cores: vLLM runs FP8 weights weight-only (Marlin), "
                     "saving memory but not compute")
    if spec.attention.sliding_window and spec.attention.sliding_layers:
        notes.append(f"{spec.attention.sliding_layers} sliding-window layers keep at most "
                     f"{spec.attention.sliding_window:,} tokens of KV per sequence")
    if spec.attention.kind == "MLA":
        notes.append("MLA: the compressed KV latent is replicated on every TP rank, so TP does not shrink "
                     "KV per GPU")
    elif spec.attention.num_kv_heads and any(l.tp > spec.attention.num_kv_heads for l in plan.layouts):
        notes.append(f"TP above {spec.attention.num_kv_heads} replicates KV heads: KV per GPU stops shrinking")
    if spec.recurrent is not None and spec.mixer is not None:
        notes.append(state_note(spec, plan))
    if spec.vision is not None:
        notes.append(vision_note(spec, req, plan))
    if req.pooling is not None:
        notes.append(pooling_note(spec, req, plan))
    if req.max_loras and plan.recommended:
        best = plan.recommended
        per_gpu = lora_slot_bytes(spec, req.max_loras, req.max_lora_rank, WEIGHT_DTYPES[plan.dtype], best.tp,
                                  max(s.layers for s in best.stages))
        notes.append(f"LoRA: {req.max_loras} adapter slot{'s' if req.max_loras > 1 else ''} of rank "
                     f"{req.max_lora_rank} (q/k/v/o, gate/up/down of every layer) take {per_gpu / GiB:.2f} GiB per GPU, "
                     "counted with the weights")
    return notes


def vision_note(spec: ModelSpec, req: PlanRequest, plan: Plan) -> str:
    """The image tower sits whole on each first-stage GPU; a step's images wait in the encoder cache."""
    assert spec.vision is not None
    dtype_bytes = WEIGHT_DTYPES[plan.dtype]
    tower = spec.vision.held * dtype_bytes
    cache = req.max_num_batched_tokens * spec.hidden_size * dtype_bytes
    return (f"vision tower and projector: {spec.vision.held:,} parameters ({tower / GiB:.2f} GiB), whole on each "
            f"first-stage GPU (not split by TP), counted with the weights; the encoder cache holds a step's images "
            f"up to {req.max_num_batched_tokens:,} embeddings ({cache / GiB:.3f} GiB) and keeps each image's until its "
            "request finishes")


def pooling_note(spec: ModelSpec, req: PlanRequest, plan: Plan) -> str:
    """A pooling model holds KV only while a prompt is computed: a step's tokens, not long conversations."""
    step = req.max_num_batched_tokens * spec.kv_bytes_per_token(plan.kv_dtype_bytes)
    return (f"{req.pooling}: requests are prefill-only and free their KV as soon as their prompt is computed, so "
            f"a step's {req.max_num_batched_tokens:,} tokens need {step / GiB:.3f} GiB of KV (the pool above is "
            "room for prompts waiting, not for long sequences); no LM head is loaded, so it is not counted")


def state_note(spec: ModelSpec, plan: Plan) -> str:
    """Recurrent layers: their state per sequence, and the slots the recommended layout holds."""
    assert spec.recurrent is not None and spec.mixer is not None
    per_sequence = plan.state_bytes_per_sequence
    note = (f"{len(spec.recurrent.layers)} of {spec.num_layers} layers are {spec.mixer.label} layers: no KV per "
            f"token, a state of {per_sequence / 2**20:.1f} MiB per sequence (the convolution's last inputs and the "
            "recurrent state) whatever its length")
    best = plan.recommended
    if best is not None and best.stages:
        slots = max(stage.state_bytes for stage in best.stages)
        note += (f"; llmctl holds a slot for each sequence it runs at once ({slots / GiB:.2f} GiB per GPU, beside "
                 "the KV cache), as many as --max-num-seqs or the memory allows: all of it less one "
                 "max-model-len sequence's KV, at most half of it beside attention layers")
    return note
