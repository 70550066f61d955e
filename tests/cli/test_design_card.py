"""The five commands of the design card, typed as it shows them, on a machine without hub access:
`llmctl inspect bigscience/bloom`, `llmctl plan --gpus 8`, `llmctl quantize --awq`, `llmctl serve --tp 4`,
`llmctl bench` — against the fixture cache for bigscience/bloom and the default model elsewhere.

The default model (SmolLM2-135M) has 9 attention heads and 3 KV heads, so `--tp 4` cannot shard it:
that command must say so in one line naming the sizes that work, and `--tp 3` then serves the
quantized model the card's `quantize --awq` made, which `bench` measures."""

from __future__ import annotations

import json

import pytest

from helpers.cli_process import run_cli
from helpers.server_helpers import start_server

pytestmark = pytest.mark.subprocess


def test_the_design_cards_five_commands_as_typed(tmp_path):
    inspect = run_cli("inspect", "bigscience/bloom")
    assert inspect.returncode == 0, inspect.stderr
    assert "BloomForCausalLM" in inspect.stdout and "ALiBi" in inspect.stdout

    plan = run_cli("plan", "--gpus", "8")
    assert plan.returncode == 0, plan.stderr
    assert "Recommended:" in plan.stdout and "llmctl serve HuggingFaceTB/SmolLM2-135M-Instruct" in plan.stdout

    # The card's `llmctl quantize --awq`, with a small calibration budget for CI's time.
    quantize = run_cli("quantize", "--awq", "--calib-samples", "2", "--calib-seq-len", "32", cwd=tmp_path,
                       timeout=900)
    assert quantize.returncode == 0, quantize.stderr
    out = tmp_path / "SmolLM2-135M-Instruct-AWQ-4bit"
    assert "calibration: 2 × 32 tokens from the model's own samples (data-free)" in quantize.stderr
    # stderr is a pipe here, as in a redirected log: a line per layer, which a progress bar cannot leave there
    lines = [line for line in quantize.stderr.splitlines() if line.startswith("AWQ 4-bit, layer by layer: ")]
    assert [line.split(": ")[1].split()[0] for line in lines] == [f"{i}/30" for i in range(1, 31)]
    assert "serve it: llmctl serve SmolLM2-135M-Instruct-AWQ-4bit" in quantize.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "awq"
    assert config["quantization_config"]["group_size"] == 64  # 128 does not divide SmolLM2's 576
    again = run_cli("quantize", "--awq", cwd=tmp_path)
    assert again.returncode == 2 and "exists and is not empty: pass --force" in again.stderr

    tp4 = run_cli("serve", "--tp", "4")
    assert tp4.returncode == 2 and "Traceback" not in tp4.stderr
    assert "9 attention heads are not divisible by TP 4" in tp4.stderr and "TP sizes that work: 1, 3" in tp4.stderr

    server = start_server(str(out), "--tp", "3", "--max-model-len", "256", timeout=300)
    try:
        bench = run_cli("bench", "serve", "--base-url", server.url, "--tokenizer", str(out), "--num-prompts", "4",
                        "--random-input-len", "16", "--random-output-len", "8", "--ignore-eos", "--save-result",
                        "--result-filename", str(tmp_path / "bench.json"))
        assert bench.returncode == 0, bench.stdout + bench.stderr
        result = json.loads((tmp_path / "bench.json").read_text())
        assert result["completed"] == 4 and result["total_output_tokens"] == 32
    finally:
        assert server.stop() == 0
