"""plan's memory prediction against real vLLM startup logs (tests/fixtures/vllm_logs).

Each log printed vLLM's own profiler breakdown; the model config and the profiling shape
(tokens, sequences, TP) are the only inputs here. Nothing the log measured is fed back in.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers.paths import FIXTURES
from llmctl.checkpoint.spec import ModelSpec
from llmctl.plan.gpus import GpuType
from llmctl.plan.planner import PlanRequest, build_plan
from llmctl.sizing.memory import ActivationShape, activation_peak_bytes
from llmctl.units import GiB

PROFILES = json.loads((FIXTURES / "vllm_logs" / "memory_profiles.json").read_text())
LOGS = PROFILES["logs"]
TOLERANCE = 0.10  # the bar: within 10 % of what vLLM measured


def logged_gib(entry: dict, pattern: str) -> float | None:
    match = re.search(pattern, "\n".join(entry["log"]))
    return float(match.group(1)) if match else None


def activation_logged(entry: dict) -> float:
    return logged_gib(entry, r"PyTorch activation peak memory(?: takes)?\s+([\d.]+)GiB")


def spec_of(entry: dict) -> ModelSpec:
    return ModelSpec.from_config(PROFILES["models"][entry["model"]])


def predicted_activation_gib(entry: dict) -> float:
    shape = ActivationShape(tokens=entry["max_num_batched_tokens"], sequences=entry["max_num_seqs"],
                            tp=entry["tp"], dtype_bytes=entry["dtype_bytes"], last_stage=entry["rank"] == 0)
    return activation_peak_bytes(spec_of(entry), shape) / GiB


def test_five_logs_of_different_models_and_gpus():
    assert len(LOGS) >= 5
    assert len({e["model"] for e in LOGS}) >= 4
    assert len({logged_gib(e, r"total_gpu_memory\s+\(?([\d.]+)GiB") for e in LOGS}) >= 4


@pytest.mark.parametrize("entry", LOGS, ids=[e["name"] for e in LOGS])
def test_activation_peak_within_ten_percent(entry):
    measured = activation_logged(entry)
    predicted = predicted_activation_gib(entry)
    assert predicted == pytest.approx(measured, rel=TOLERANCE), f"{entry['name']}: {predicted:.2f} vs {measured:.2f} GiB"


def test_the_sampler_dominates_at_small_batches_and_the_mlp_at_long_steps():
    """The two regimes the logs show: TP does not shrink the sampler's peak (rank 0 holds the
    whole vocabulary), a 32K-token step is bound by the MLP."""
    tp1, tp2 = (e for e in LOGS if e["model"] == "meta-llama/Meta-Llama-3-8B")
    assert activation_logged(tp1) == activation_logged(tp2)
    assert predicted_activation_gib(tp1) == pytest.approx(predicted_activation_gib(tp2), rel=1e-3)
    long_step = next(e for e in LOGS if e["max_num_batched_tokens"] == 32768)
    no_sampler = {**long_step, "rank": 1}
    assert predicted_activation_gib(no_sampler) == pytest.approx(predicted_activation_gib(long_step))


KV_LOGS = [e for e in LOGS if logged_gib(e, r"(?:available_kv_cache_memory|KV Cache is)\s+(-?[\d.]+)GiB")]


@pytest.mark.parametrize("entry", KV_LOGS, ids=[e["name"] for e in KV_LOGS])
def test_kv_cache_predicted_from_the_config_alone(entry):
    total = logged_gib(entry, r"total_gpu_memory\s+\(?([\d.]+)GiB")
    utilization = logged_gib(entry, r"gpu_memory_utilization\s+\(?([\d.]+)")
    gpu = GpuType(key="logged", name=entry["name"], memory_bytes=int(total * GiB), interconnect="PCIe", fp8=False)
    dtype = "float16" if "float16" in entry["name"] else "auto"
    request = PlanRequest(gpu=gpu, gpus=entry["tp"], tp=entry["tp"], gpu_memory_utilization=utilization, dtype=dtype,
                          max_model_len=entry["max_model_len"], max_num_seqs=entry["max_num_seqs"],
                          max_num_batched_tokens=entry["max_num_batched_tokens"])
    [layout] = build_plan(spec_of(entry), request, entry["model"], suggest=False).layouts
    weights = logged_gib(entry, r"model weights take\s+([\d.]+)GiB")
    kv = logged_gib(entry, r"(?:available_kv_cache_memory|KV Cache is)\s+(-?[\d.]+)GiB")
    assert layout.weights_bytes / GiB == pytest.approx(weights, rel=0.02)
    assert layout.kv_bytes / GiB == pytest.approx(kv, rel=TOLERANCE), f"{layout.kv_bytes / GiB:.2f} vs {kv:.2f} GiB"


def test_blocks_and_concurrency_of_a_complete_log():
    """The T4 log prints every number down to blocks: the prediction lands within 10 % of them."""
    entry = next(e for e in LOGS if "T4" in e["name"])
    text = "\n".join(entry["log"])
    blocks = int(re.search(r"# CUDA blocks: (\d+)", text).group(1))
    concurrency = float(re.search(r"per request: ([\d.]+)x", text).group(1))
    gpu = GpuType(key="t4", name="Tesla T4", memory_bytes=int(14.56 * GiB), interconnect="PCIe", fp8=False)
    request = PlanRequest(gpu=gpu, tp=1, gpu_memory_utilization=0.5, dtype="float16", max_model_len=32768,
                          max_num_batched_tokens=32768)
    layout = build_plan(spec_of(entry), request, entry["model"], suggest=False).recommended
    assert layout.kv_blocks == pytest.approx(blocks, rel=TOLERANCE)
    assert layout.max_concurrency == pytest.approx(concurrency, rel=TOLERANCE)


def test_logs_left_unchecked_say_why():
    for entry in PROFILES["unchecked"]:
        assert entry["reason"] and "activation peak memory" in entry["log"]
