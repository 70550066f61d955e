"""Every `llmctl serve` (and `llmctl quantize`) line `plan` prints parses through serve's own parser and passes
`EngineConfig.validate()`: for the hub fixtures and every --kv-cache-dtype, --dtype, quantization and GPU count
plan takes. `plan` once printed `--kv-cache-dtype fp8_e5m2` (or `float32`, `half`) lines that serve refused."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from helpers.command_line import engine_config, parse_line
from llmctl.cli import app
from llmctl.errors import LlmctlError
from llmctl.settings import KV_CACHE_FORMATS

MODELS = ["", "meta-llama/Llama-2-7b-hf", "bigscience/bloom",
          "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen-72B", "TheBloke/Llama-2-13B-chat-GPTQ"]
KV = list(KV_CACHE_FORMATS)
DTYPES = ["auto", "bfloat16", "float16", "float32", "half"]
QUANTIZATION = [None, "awq", "gptq", "fp8", "int8"]
GPUS = [("1", ()), ("8", ()), ("16", ("--nodes", "2")), ("8", ("--enable-expert-parallel",)),
        ("4", ("--max-loras", "2", "--max-num-seqs", "64"))]


def plan_cases() -> list[tuple[str, str, str, str | None, tuple[str, tuple[str, ...]]]]:
    """The default model with every kv format × dtype; each model with every kv format, the dtype, quantization
    and GPU choices cycled over them (LoRA slots only on dense models: plan refuses them on MoE, by design)."""
    cases = [("", kv, dtype, QUANTIZATION[i % 5], GPUS[i % 5]) for i, (kv, dtype) in
             enumerate(itertools.product(KV, DTYPES))]
    for m, model in enumerate(MODELS[1:], start=1):
        gpus = [g for g in GPUS if "--max-loras" not in g[1]] if "Mixtral" in model else GPUS
        cases += [(model, kv, DTYPES[(i + m) % len(DTYPES)], QUANTIZATION[(i + m) % len(QUANTIZATION)],
                   gpus[(i + 2 * m) % len(gpus)]) for i, kv in enumerate(KV)]
    return cases


def plan_commands(model: str, kv: str, dtype: str, quantization: str | None, gpus: tuple[str, tuple[str, ...]]):
    args = ["plan", *([model] if model else []), "--json", "--kv-cache-dtype", kv, "--dtype", dtype, "--gpus", gpus[0], *gpus[1]]
    args += ["--quantization", quantization] if quantization else []
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):  # exit 1: nothing fits
        return None, repr(result.exception)
    return json.loads(result.output)["commands"], result.output


def test_plan_prints_only_serve_lines_serve_takes() -> None:
    checked, refused = 0, []
    for case in plan_cases():
        commands, output = plan_commands(*case)
        if commands is None:
            refused.append((case, output))
            continue
        for line in (c for c in commands if c.startswith("llmctl ")):
            name, params = parse_line(line.split("   #")[0])
            if name == "serve":
                engine_config(params).validate()
            checked += 1
    # plan refuses only what neither llmctl nor vLLM takes: here, nothing
    assert not refused, refused[:3]
    assert checked > 30, checked  # the matrix really printed llmctl lines


@pytest.mark.parametrize("kv", ["float32", "half", "fp8_e4m3fnuz"])
def test_plan_refuses_a_kv_cache_dtype_neither_serves(kv: str) -> None:
    result = CliRunner().invoke(app, ["plan", "--kv-cache-dtype", kv])
    error = result.exception
    assert isinstance(error, LlmctlError) and error.exit_code == 2 and f"--kv-cache-dtype {kv!r}" in str(error)
