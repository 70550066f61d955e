"""Layout search: every TP × PP that divides the GPU count, evaluated and explained."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from llmctl.checkpoint.params import count_from_config
from llmctl.checkpoint.quant_schemes import layer_quantization, sizing_quantization
from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import LlmctlError
from llmctl.plan.gguf_sizes import GgufSizes
from llmctl.plan.gpus import GPU_CATALOG, GpuType
from llmctl.plan.notes import plan_notes
from llmctl.plan.ray_lines import ray_commands
from llmctl.settings import DEFAULT_MAX_NUM_SEQS
from llmctl.sizing.kv import BLOCK_SIZE, UNBOUNDED, StageKV, kv_dtype_bytes, planned_kv_format, stage_kv
from llmctl.sizing.layout import structural_problems
from llmctl.sizing.lora import lora_slot_bytes, lora_targets
from llmctl.sizing.memory import (
    ActivationShape,
    MemoryBudget,
    activation_peak_bytes,
    kv_pool,
    max_concurrency,
    runtime_overhead_bytes,
    state_slots,
)
from llmctl.sizing.weights import (
    WEIGHT_DTYPES,
    WeightFormat,
    mxfp4_split_problem,
    stage_weights,
    vllm_pipeline_stages,
    weight_format,
)
from llmctl.units import GiB

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM's chunked-prefill budget for serving on data-center GPUs


@dataclass(frozen=True)
class PlanRequest:
    gpu: GpuType
    gpus: int = 1
    nodes: int = 1
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    tp: int | None = None
    pp: int | None = None
    expert_parallel: bool = False
    gguf: GgufSizes | None = None  # a .gguf model: its tensors stay in their GGUF blocks (as vLLM holds them)
    enforce_eager: bool = False
    block_size: int = BLOCK_SIZE
    min_concurrency: float = 1.0  # full-length sequences a replica must hold to be recommended
    max_loras: int = 0  # --max-loras: resident LoRA adapter slots (0: no LoRA)
    max_lora_rank: int = 16
    pp_layer_partition: str | None = None  # VLLM_PP_LAYER_PARTITION: layers per stage, e.g. "24,40"
    llmctl_impl: str | None = "llmctl"  # what llmctl serve runs it with: llmctl, transformers or None (the CLI asks)
    llmctl_refusal: str = ""  # why llmctl serve cannot run it, when llmctl_impl is None
    pooling: str | None = None  # a pooling model (embedding, classifier): PoolingSpec.describe(); None: it generates

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass(frozen=True)
class MeasuredMemory:
    """Per-GPU numbers measured on a real run; they replace the planner's estimates."""

    weights_bytes: int | None = None
    activation_bytes: int | None = None
    overhead_bytes: int | None = None


@dataclass
class StagePlan:
    stage: int
    layers: int
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    kv_available_bytes: int
    kv_blocks: int
    kv_tokens: int
    kv_bytes_per_token: int  # this GPU, all of its layers
    max_concurrency: float
    max_model_len_that_fits: int
    state_bytes: int = 0  # recurrent layers (Mamba2): their state for --max-num-seqs sequences, beside the KV


@dataclass
class LayoutPlan:
    tp: int
    pp: int
    replicas: int  # independent copies (data parallel) on the remaining GPUs
    feasible: bool = True
    problems: list[str] = field(default_factory=list)
    stages: list[StagePlan] = field(default_factory=list)

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    def _worst(self, attr: str, pick=max):
        return pick(getattr(s, attr) for s in self.stages) if self.stages else 0

    @property
    def weights_bytes(self) -> int:
        return self._worst("weights_bytes")

    @property
    def non_kv_bytes(self) -> int:
        return max((s.activation_bytes + s.overhead_bytes for s in self.stages), default=0)

    @property
    def kv_bytes(self) -> int:
        return self._worst("kv_available_bytes", min)

    def _attending(self) -> list[StagePlan]:
        """The stages that keep K/V: one of recurrent or MLP layers only (Nemotron-H, Mamba2) holds none and
        limits nothing."""
        return [s for s in self.stages if s.kv_bytes_per_token] or self.stages

    @property
    def kv_blocks(self) -> int:
        return min((s.kv_blocks for s in self._attending()), default=0)

    @property
    def kv_tokens(self) -> int:
        return min((s.kv_tokens for s in self._attending()), default=0)

    @property
    def max_concurrency(self) -> float:
        return self._worst("max_concurrency", min)

    @property
    def max_model_len_that_fits(self) -> int:
        return self._worst("max_model_len_that_fits", min)


@dataclass
class Plan:
    model: str
    spec: ModelSpec
    request: PlanRequest
    dtype: str
    weight_format: str
    kv_dtype_bytes: int
    max_model_len: int
    total_params: int | None
    active_params: int | None
    kv_bytes_per_token_model: int  # all layers, before parallelism
    layouts: list[LayoutPlan]
    recommended: LayoutPlan | None
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    state_bytes_per_sequence: int = 0  # recurrent layers (Mamba2), all of them, whatever the sequence's length
    vllm_log: list[str] = field(default_factory=list)


def resolve_dtype(dtype: str, spec: ModelSpec) -> str:
    """vLLM's `--dtype auto`: the checkpoint's 16-bit dtype; float32 checkpoints run in bfloat16."""
    name = dtype.lower()
    if name == "auto":
        own = (spec.torch_dtype or "bfloat16").lower()
        return own if own in ("bfloat16", "float16") else "bfloat16"
    if name not in WEIGHT_DTYPES:
        raise LlmctlError(f"unknown --dtype {dtype!r}; choose auto, bfloat16, float16 or float32")
    return {"bf16": "bfloat16", "half": "float16", "fp16": "float16", "float": "float32"}.get(name, name)


def candidate_layouts(gpus: int) -> list[tuple[int, int]]:
    """Every (TP, PP) whose product divides the GPU count."""
    return [(tp, pp) for tp in range(1, gpus + 1) for pp in range(1, gpus + 1)
            if gpus % (tp * pp) == 0]


def expert_ranks(req: PlanRequest, tp: int, pp: int) -> int:
    """With --enable-expert-parallel, experts spread over TP × DP ranks (vLLM's EP size); 0 without it."""
    return tp * max(1, req.gpus // (tp * pp)) if req.expert_parallel else 0


def evaluate_layout(spec: ModelSpec, req: PlanRequest, tp: int, pp: int, *, dtype_bytes: int, fmt: WeightFormat,
                    kv_bytes: int, max_model_len: int, measured: MeasuredMemory | None = None) -> LayoutPlan:
    layout = LayoutPlan(tp=tp, pp=pp, replicas=max(1, req.gpus // (tp * pp)))
    layout.problems = structural_problems(spec, fmt, tp, pp, req.gpus_per_node, expert_ranks(req, tp, pp),
                                          req.expert_parallel)
    if layout.problems:
        layout.feasible = False
        return layout
    partition = req.pp_layer_partition
    if partition is not None and len(partition.split(",")) != pp:
        layout.problems = [f"VLLM_PP_LAYER_PARTITION={partition!r} names {len(partition.split(','))} stages, "
                           f"not {pp}: vLLM refuses it"]
        layout.feasible = False
        return layout
    stages = vllm_pipeline_stages(spec.num_layers, pp, partition)  # the GPUs this plans are vLLM's
    weights = stage_weights(spec, fmt, tp, pp, expert_ranks(req, tp, pp), stages)
    for index, layers in enumerate(stages):
        lora = lora_slot_bytes(spec, req.max_loras, req.max_lora_rank, dtype_bytes, tp, len(layers)) \
            if req.max_loras else 0  # resident adapter slots sit beside the weights
        layout.stages.append(_plan_stage(spec, req, index, layers, weights[index].total_bytes + lora, tp, pp,
                                         dtype_bytes, kv_bytes, max_model_len, measured))
    layout.problems = _memory_problems(layout, req, max_model_len)
    layout.feasible = not layout.problems
    return layout


def _plan_stage(spec: ModelSpec, req: PlanRequest, index: int, layers: range, weights_bytes: int, tp: int, pp: int,
                dtype_bytes: int, kv_bytes: int, max_model_len: int, measured: MeasuredMemory | None) -> StagePlan:
    measured = measured or MeasuredMemory()
    shape = ActivationShape(tokens=req.max_num_batched_tokens, sequences=req.max_num_seqs, tp=tp,
                            dtype_bytes=dtype_bytes, last_stage=index == pp - 1)
    budget = MemoryBudget(
        total_bytes=req.gpu.memory_bytes,
        utilization=req.gpu_memory_utilization,
        weights_bytes=_pick(measured.weights_bytes, weights_bytes),
        activation_bytes=_pick(measured.activation_bytes, activation_peak_bytes(spec, shape)),
        overhead_bytes=_pick(measured.overhead_bytes, runtime_overhead_bytes(tp, pp)),
    )
    geometry: StageKV = stage_kv(spec, tp, layers, kv_bytes, req.block_size)
    # llmctl holds a state slot per --max-num-seqs sequence, taken from the budget before the KV pool
    step = req.max_num_batched_tokens
    per_sequence = stage_state_bytes(spec, layers, dtype_bytes, tp)
    slots = state_slots(budget.kv_bytes, per_sequence, geometry.sequence_bytes(max_model_len, step),
                        req.max_num_seqs) if per_sequence else 0
    states = slots * per_sequence
    available = budget.kv_bytes - states
    pool = kv_pool(available, geometry)
    concurrency = max_concurrency(pool, geometry, max_model_len, step)
    fits = geometry.max_length(pool.allocated_bytes, step)
    if per_sequence:  # a sequence needs a state slot as well as its blocks; with no attention layer, only that
        concurrency = min(concurrency, slots) if geometry.block_bytes else float(slots)
        fits = fits if geometry.block_bytes else (UNBOUNDED if slots else 0)
    return StagePlan(
        stage=index, layers=len(layers), weights_bytes=budget.weights_bytes,
        activation_bytes=budget.activation_bytes, overhead_bytes=budget.overhead_bytes,
        kv_available_bytes=available, kv_blocks=pool.num_blocks, kv_tokens=pool.tokens,
        kv_bytes_per_token=geometry.bytes_per_token, max_concurrency=concurrency, max_model_len_that_fits=fits,
        state_bytes=states,
    )


def stage_state_bytes(spec: ModelSpec, layers: range, dtype_bytes: int, tp: int = 1) -> int:
    """One sequence's state in this stage's recurrent layers, on one TP rank (Mamba2, gated DeltaNet)."""
    if spec.recurrent is None or spec.mixer is None:
        return 0
    return sum(1 for layer in spec.recurrent.layers if layer in layers) * spec.mixer.state_bytes(dtype_bytes, tp)


def _pick(measured: int | None, estimate: int) -> int:
    return estimate if measured is None else measured


def _memory_problems(layout: LayoutPlan, req: PlanRequest, max_model_len: int) -> list[str]:
    usable = int(req.gpu.memory_bytes * req.gpu_memory_utilization)
    problems = []
    for stage in layout.stages:
        where = f" (stage {stage.stage})" if layout.pp > 1 else ""
        if stage.kv_available_bytes <= 0:
            problems.append(
                f"does not fit{where}: weights {_gib(stage.weights_bytes)} + activations "
                f"{_gib(stage.activation_bytes)} + runtime {_gib(stage.overhead_bytes)} exceed the usable "
                f"{_gib(usable)} ({req.gpu_memory_utilization:g} × {_gib(req.gpu.memory_bytes)})")
        elif stage.max_model_len_that_fits < max_model_len:
            problems.append(
                f"KV cache{where} holds {stage.max_model_len_that_fits:,} tokens, less than one "
                f"{max_model_len:,}-token sequence")
    return problems[:1] if len(problems) > 1 and all("does not fit" in p for p in problems) else problems


def _gib(count: int) -> str:
    return f"{count / GiB:.2f} GiB"


def recommend(layouts: list[LayoutPlan], min_concurrency: float) -> LayoutPlan | None:
    """The smallest model-parallel group whose replica holds `min_concurrency` full-length
    sequences (the rest of the GPUs become replicas); TP before PP. Else the most concurrent."""
    feasible = [layout for layout in layouts if layout.feasible]
    enough = [layout for layout in feasible if layout.max_concurrency >= min_concurrency]
    if enough:
        return min(enough, key=lambda l: (l.gpus_per_replica, l.pp, -l.max_concurrency))
    return max(feasible, key=lambda l: (l.max_concurrency, -l.gpus_per_replica), default=None)


def build_plan(spec: ModelSpec, req: PlanRequest, model: str, measured: MeasuredMemory | None = None,
               *, suggest: bool = True) -> Plan:
    _validate(spec, req)
    dtype = resolve_dtype(req.dtype, spec)
    dtype_bytes = WEIGHT_DTYPES[dtype]
    stored = sizing_quantization(spec.quantization)
    quantization = req.quantization or (stored.method if stored else None)
    if quantization and quantization not in ("awq", "gptq", "fp8", "int8", "mxfp4"):
        quantization = None  # a checkpoint format we do not size (e.g. bitsandbytes): plan it as 16-bit
    fmt = weight_format(dtype_bytes, quantization, spec)
    if req.gguf is not None and req.quantization is None:
        fmt = WeightFormat(f"GGUF {'/'.join(req.gguf.types)}", dense_bytes=dtype_bytes, bits=req.gguf.linear_bits,
                           scale_kind="gguf", table_bits=req.gguf.table_bits)
    kv_bytes = kv_dtype_bytes(req.kv_cache_dtype, dtype_bytes)
    max_model_len = req.max_model_len or spec.max_context
    if req.tp or req.pp:
        pairs = [(req.tp or 1, req.pp or 1)]
    else:
        pairs = candidate_layouts(req.gpus)
    layouts = [evaluate_layout(spec, req, tp, pp, dtype_bytes=dtype_bytes, fmt=fmt, kv_bytes=kv_bytes,
                               max_model_len=max_model_len, measured=measured) for tp, pp in pairs]
    counts = count_from_config(spec)
    plan = Plan(
        model=model, spec=spec, request=req, dtype=dtype, weight_format=fmt.name if fmt.quantized else dtype,
        kv_dtype_bytes=kv_bytes, max_model_len=max_model_len,
        total_params=counts.total if counts else None, active_params=counts.active if counts else None,
        kv_bytes_per_token_model=spec.kv_bytes_per_token(kv_bytes), layouts=layouts,
        state_bytes_per_sequence=spec.state_bytes_per_sequence(dtype_bytes),
        recommended=recommend(layouts, req.min_concurrency),
    )
    plan.notes = plan_notes(spec, req, fmt, plan)
    if suggest and (plan.recommended is None or plan.recommended.max_concurrency < req.min_concurrency):
        plan.suggestions = _suggestions(spec, req, model, plan)
    if plan.recommended:
        plan.commands = serve_commands(model, plan, quantization, fmt)
        plan.vllm_log = vllm_log_lines(plan.recommended, max_model_len)
    return plan


def _validate(spec: ModelSpec, req: PlanRequest) -> None:
    if req.gpus < 1:
        raise LlmctlError("--gpus must be at least 1")
    if req.nodes < 1 or req.gpus % req.nodes:
        raise LlmctlError(f"{req.gpus} GPUs cannot be spread evenly over {req.nodes} nodes; pass --gpus-per-node")
    if not 0 < req.gpu_memory_utilization <= 1:
        raise LlmctlError(f"--gpu-memory-utilization must be in (0, 1], got {req.gpu_memory_utilization}")
    for flag, value in (("--tp", req.tp), ("--pp", req.pp)):
        if value is not None and value < 1:
            raise LlmctlError(f"{flag} must be at least 1")
    if (req.tp or 1) * (req.pp or 1) > req.gpus:
        raise LlmctlError(f"TP {req.tp or 1} × PP {req.pp or 1} needs {(req.tp or 1) * (req.pp or 1)} GPUs; "
                          f"only {req.gpus} given (pass --gpus)")
    if req.max_model_len is not None and req.max_model_len > spec.max_context:
        raise LlmctlError(f"--max-model-len {req.max_model_len} is longer than the model's context "
                          f"({spec.max_context}, from {spec.context_source}); vLLM refuses it too")
    if req.max_model_len is not None and req.max_model_len < 1:
        raise LlmctlError("--max-model-len must be at least 1")
    if req.max_loras < 0 or req.max_lora_rank < 1:
        raise LlmctlError("--max-loras must be 0 or more and --max-lora-rank at least 1")
    if req.max_loras:
        lora_targets(spec)  # an error for layers LoRA slots are not counted for (MoE, MLA)
    if req.max_num_seqs < 1 or req.max_num_batched_tokens < 1:
        raise LlmctlError("--max-num-seqs and --max-num-batched-tokens must be at least 1")
    planned_kv_format(req.kv_cache_dtype)  # an error for a format neither llmctl nor vLLM serves


def _suggestions(spec: ModelSpec, req: PlanRequest, model: str, plan: Plan) -> list[str]:
    """What would make it fit: each alternative is re-planned, not guessed."""
    out = []

    def fits(**changes) -> Plan | None:
        trial = build_plan(spec, dataclasses.replace(req, **changes), model, suggest=False)
        good = trial.recommended
        return trial if good and good.max_concurrency >= req.min_concurrency else None

    if not (req.quantization or spec.quantization):
        trial = fits(quantization="awq")
        if trial:
            out.append(f"quantize to 4 bits (llmctl quantize --awq, then --quantization awq): fits at "
                       f"TP {trial.recommended.tp} × PP {trial.recommended.pp}")
    if req.kv_cache_dtype == "auto" and plan.kv_dtype_bytes > 1:
        trial = fits(kv_cache_dtype="fp8")
        if trial:
            out.append(f"--kv-cache-dtype fp8 halves KV per token: fits at TP {trial.recommended.tp} × "
                       f"PP {trial.recommended.pp}")
    longest = max((l.max_model_len_that_fits for l in plan.layouts if l.stages and l.kv_blocks), default=0)
    if 0 < longest < plan.max_model_len:
        out.append(f"shorter context: --max-model-len {longest:,} fits one sequence "
                   f"(asked {plan.max_model_len:,})")
    for more in (2, 4, 8, 16):
        gpus = req.gpus * more
        nodes = max(req.nodes, math.ceil(gpus / max(req.gpus_per_node, 8)))
        if gpus % nodes:
            continue
        trial = fits(gpus=gpus, nodes=nodes, tp=None, pp=None)
        if trial:
            best = trial.recommended
            out.append(f"more GPUs: {gpus} × {req.gpu.key} ({nodes} node{'s' if nodes > 1 else ''}) fit at "
                       f"TP {best.tp} × PP {best.pp}")
            break
    for gpu in sorted(GPU_CATALOG, key=lambda g: g.memory_bytes):
        if gpu.memory_bytes > req.gpu.memory_bytes and fits(gpu=gpu):
            out.append(f"bigger GPUs: {req.gpus} × {gpu.key} ({gpu.memory_gib:.0f} GiB) fit")
            break
    return out


# Flags plan may need that `llmctl serve` refuses today; a layout needing one gets no llmctl command.
LLMCTL_SERVE_LACKS = ("--quantization",)


def serve_commands(model: str, plan: Plan, quantization: str | None, fmt: WeightFormat) -> list[str]:
    """`llmctl serve` and `vllm serve` command lines that realize the recommended layout; every
    llmctl flag here is one `llmctl serve` accepts (tests parse them)."""
    best, req = plan.recommended, plan.request
    assert best is not None
    target = model
    stored = sizing_quantization(plan.spec.quantization)  # the checkpoint's own format, as plan sized it
    as_stored = stored is not None and stored.method == fmt.name
    prequantize = fmt.name in ("awq", "gptq") and not as_stored
    commands = []
    if prequantize:
        target = f"./{model.rstrip('/').split('/')[-1]}-{fmt.name}"
        commands.append(f"llmctl quantize {model} --{fmt.name} --output {target}")
    flags = [f"--tensor-parallel-size {best.tp}"]
    if best.pp > 1:
        flags.append(f"--pipeline-parallel-size {best.pp}")
    flags += [f"--max-model-len {plan.max_model_len}", f"--gpu-memory-utilization {req.gpu_memory_utilization:g}"]
    if req.dtype != "auto":
        flags.append(f"--dtype {plan.dtype}")
    if fmt.name in ("fp8", "int8") and not as_stored:
        flags.append(f"--quantization {fmt.name}")
    if req.kv_cache_dtype != "auto":
        flags.append(f"--kv-cache-dtype {req.kv_cache_dtype}")
    if req.max_num_seqs != DEFAULT_MAX_NUM_SEQS:
        flags.append(f"--max-num-seqs {req.max_num_seqs}")
    if req.max_num_batched_tokens != DEFAULT_MAX_NUM_BATCHED_TOKENS:
        flags.append(f"--max-num-batched-tokens {req.max_num_batched_tokens}")
    if req.expert_parallel:
        flags.append("--enable-expert-parallel")
    if req.enforce_eager:
        flags.append("--enforce-eager")
    if req.max_loras:
        flags.append(f"--enable-lora --max-loras {req.max_loras} --max-lora-rank {req.max_lora_rank}")
    unsupported = [f for f in flags if f.split()[0] in LLMCTL_SERVE_LACKS]
    if req.llmctl_impl is None:
        unsupported.insert(0, req.llmctl_refusal or
                           f"its architecture {', '.join(plan.spec.architectures) or plan.spec.model_type}")
    elif req.llmctl_impl == "transformers" and best.tp * best.pp > 1:
        unsupported.insert(0, "--model-impl transformers with TP × PP > 1")
    if req.max_loras and best.tp * best.pp > 1:
        unsupported.append("--enable-lora with TP × PP > 1")
    if req.expert_parallel and best.pp > 1 and best.replicas > 1:
        unsupported.append("--enable-expert-parallel over replicas with PP > 1")
    if fmt.name == "mxfp4" and plan.spec.moe and not req.expert_parallel and \
            (why := mxfp4_split_problem(plan.spec.moe.expert_intermediate_size, best.tp)):
        unsupported.append(why)
    if not _fits_as_llmctl_holds_it(plan, best, fmt):
        unsupported.append(f"its {fmt.name} weights, which llmctl dequantizes to {plan.dtype} at load, do not fit")
    if unsupported:
        plan.notes.append(f"llmctl serve cannot run this layout yet ({', '.join(unsupported)}): the vllm serve "
                          "command below can")
    else:
        llmctl_flags = [f.replace("--tensor-parallel-size", "--tp").replace("--pipeline-parallel-size", "--pp")
                        for f in flags] + ([f"--dp {best.replicas}"] if best.replicas > 1 else [])
        commands.append(f"llmctl serve {target} " + " ".join(llmctl_flags))
    vllm_flags = flags + ([f"--data-parallel-size {best.replicas}"] if best.replicas > 1 else [])
    commands.append(f"vllm serve {target} " + " ".join(vllm_flags))
    # replicas with expert parallelism step together in one process: not on Ray
    replicas_on_ray = best.replicas if not req.expert_parallel else 1
    return commands + ray_commands(commands, best.tp * best.pp, replicas_on_ray, req.nodes)


def _fits_as_llmctl_holds_it(plan: Plan, best: LayoutPlan, fmt: WeightFormat) -> bool:
    """Whether the layout still fits as llmctl holds the checkpoint on GPUs: GPTQ/AWQ (and compressed-tensors
    4-bit) stay packed as plan sized them; FP8, the other compressed-tensors schemes and GPTQ/AWQ routed experts
    are dequantized once at load — then the layout is weighed dense (attention included: an upper bound)."""
    quant = plan.spec.quantization
    if quant is None or plan.request.quantization or sizing_quantization(quant) is None or quant.method == "mxfp4":
        return True  # nothing pre-quantized, a checkpoint plan sizes at 16 bits anyway, or MXFP4 kept on GPUs
    form = layer_quantization(quant, plan.spec.moe is not None)
    if form is not None and form.method in ("gptq", "awq") and not (plan.spec.moe and quant.method in ("gptq", "awq")):
        return True
    dense = weight_format(WEIGHT_DTYPES[plan.dtype], None, plan.spec)
    layout = evaluate_layout(plan.spec, plan.request, best.tp, best.pp, dtype_bytes=dense.dense_bytes, fmt=dense,
                             kv_bytes=plan.kv_dtype_bytes, max_model_len=plan.max_model_len)
    return layout.feasible


def vllm_log_lines(layout: LayoutPlan, max_model_len: int) -> list[str]:
    """The two lines vLLM's startup log prints about the KV cache, from our numbers."""
    return [
        f"GPU KV cache size: {layout.kv_tokens:,} tokens",
        f"Maximum concurrency for {max_model_len:,} tokens per request: {layout.max_concurrency:.2f}x",
    ]
