"""The `llmctl` command as a user runs it: tables, --json, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli_process import run_cli
from helpers.hubcache import fixture_repos

pytestmark = pytest.mark.subprocess

INSPECTABLE = [r for r in fixture_repos() if r != "Qwen/Qwen2.5-7B-Instruct"]  # that one is a card only


@pytest.mark.parametrize("repo_id", INSPECTABLE)
def test_inspect_every_fixture_as_json(repo_id: str) -> None:
    result = run_cli("inspect", repo_id, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["source"]["repo_id"] == repo_id
    assert report["spec"]["num_layers"] > 0 and report["weights"]["params"] > 0
    assert report["kv_bytes_per_token_16bit"] > 0
    assert report["license"]["license"]["id"]
    assert report["backend"]["backend"] in ("cpu", "torch", "triton", "mla")


def test_inspect_bloom_table() -> None:
    result = run_cli("inspect", "bigscience/bloom")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in ("ALiBi", "176,247,271,424", "4,014,080", "decoder-only", "templates/bloom.jinja",
                 "bigscience-bloom-rail-1.0", "adding the ALiBi bias itself"):
        assert text in out, text


def test_inspect_qwen1_needs_remote_code() -> None:
    result = run_cli("inspect", "Qwen/Qwen-72B")
    assert result.returncode == 0
    assert "--trust-remote-code" in result.stdout and "QWenTokenizer" in result.stdout


def test_inspect_default_model_with_text(default_source) -> None:
    result = run_cli("inspect", "--text", "Bonjour, café ☕", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    pieces = [piece for _, piece in report["text_tokens"]]
    assert "".join(pieces).replace("\ufffd", "") in ("Bonjour, café ☕", "Bonjour, café ")
    assert report["source"]["name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert report["tokenizer"]["chat_template"]["source"] == "chat_template.jinja"
    assert report["weights"]["counts_agree"] is True


def test_help_lists_only_built_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    for built in ("inspect", "license", " plan ", " serve ", " quantize ", " bench "):
        assert built in result.stdout
    bench = run_cli("bench", "--help")
    assert " serve " in bench.stdout and " offline " in bench.stdout


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{broken")
    result = run_cli("inspect", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("error: config.json in") and "Traceback" not in result.stderr
    missing = run_cli("inspect", "nobody/nothing")
    assert missing.returncode == 2 and "hf download nobody/nothing" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_text_needs_a_tokenizer() -> None:
    result = run_cli("inspect", "bigscience/bloom", "--text", "hi")
    assert result.returncode == 2 and "cannot tokenize --text" in result.stderr


def test_card_only_repo_is_not_a_model_but_has_a_license() -> None:
    result = run_cli("inspect", "Qwen/Qwen2.5-7B-Instruct")
    assert result.returncode == 2 and "has no config.json" in result.stderr
    license_result = run_cli("license", "Qwen/Qwen2.5-7B-Instruct", "--json")
    assert license_result.returncode == 0
    report = json.loads(license_result.stdout)["report"]
    assert report["license"]["id"] == "apache-2.0" and report["base_model"] == "Qwen/Qwen2.5-7B"


def test_usage_errors_and_version() -> None:
    bogus = run_cli("inspect", "--bogus")
    assert bogus.returncode == 2 and "No such option" in bogus.stderr and "Traceback" not in bogus.stderr
    assert run_cli().returncode == 0  # bare `llmctl` shows help
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("llmctl ")


def test_the_backend_inspect_names_is_the_one_serve_runs() -> None:
    from llmctl.checkpoint.config_file import load_spec
    from llmctl.checkpoint.source import resolve_model
    from llmctl.engine.attention_selector import choose_attention_backend

    bloom = load_spec(resolve_model("bigscience/bloom", weights=False))
    on_gpu = choose_attention_backend(bloom, cuda=True)
    assert on_gpu.backend == "triton" and "adding the ALiBi bias itself" in on_gpu.reason
    on_cpu = choose_attention_backend(bloom, cuda=False)
    assert on_cpu.backend == "cpu" and "adding the ALiBi bias itself" in on_cpu.reason  # g++ and ninja are here
    assert choose_attention_backend(bloom, cuda=False, kv_cache_dtype="fp8").backend == "torch"
    assert choose_attention_backend(bloom, cuda=True, requested="torch").backend == "torch"


@pytest.mark.parametrize("command", [("serve",), ("bench", "offline")])
def test_vllms_short_parallel_flags(command: tuple[str, ...]) -> None:
    """vLLM's -tp / -pp / -dp (`vllm serve -tp 2`) reach the same settings as the long names."""
    for short, long in (("-tp", "--tensor-parallel-size"), ("-pp", "--pipeline-parallel-size"),
                        ("-dp", "--data-parallel-size")):
        result = run_cli(*command, short, "0")
        assert result.returncode == 2 and f"{long} must be at least 1 (got 0)" in result.stderr


def test_plan_takes_vllms_short_parallel_flags() -> None:
    result = run_cli("plan", "-tp", "1", "-pp", "1", "--json")
    assert result.returncode == 0
    assert [(l["tp"], l["pp"]) for l in json.loads(result.stdout)["layouts"]] == [(1, 1)]


@pytest.mark.parametrize("repo_id,impl,served", [
    ("bigscience/bloom", "llmctl", True), ("meta-llama/Llama-2-7b-hf", "llmctl", True),
    # FP8 weights, read by llmctl's own layers but dequantized to bfloat16: 16 GPUs hold them only as fp8
    ("deepseek-ai/DeepSeek-R1", "llmctl", False),
    ("mistralai/Mixtral-8x7B-v0.1", "llmctl", True)])  # MoE: llmctl's own layers, sharded like dense ones
def test_plan_and_inspect_name_what_llmctl_serve_runs(repo_id: str, impl: str | None, served: bool) -> None:
    report = json.loads(run_cli("inspect", repo_id, "--json").stdout)
    assert report["implementation"] == impl and report["llmctl_serves"] is (impl is not None)
    plan = json.loads(run_cli("plan", repo_id, "--gpus", "16", "--nodes", "2", "--json").stdout)
    if not served:
        assert any("its fp8 weights, which llmctl dequantizes to bfloat16 at load, do not fit" in note
                   for note in plan["notes"])
    assert plan["llmctl_implementation"] == impl
    assert any(c.startswith("vllm serve") for c in plan["commands"])
    assert any(c.startswith("llmctl serve") for c in plan["commands"]) is served  # 16 GPUs: a sharded layout
