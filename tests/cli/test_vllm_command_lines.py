"""`vllm serve` and `vllm bench serve` command lines copied from vLLM's own docs and source parse as
`llmctl serve` / `llmctl bench serve`, with the values vLLM gives them; the few vLLM flags llmctl does
not take are named here, and refused by name."""

from __future__ import annotations

import shlex

import pytest

from helpers.command_line import parse
from helpers.paths import FIXTURES
from llmctl.bench.endpoint import resolve_endpoint
from llmctl.cli.app import spread_multi_values
from llmctl.cli.common import parse_bytes, parse_count
from llmctl.cli.serve import parse_origins

LINES = FIXTURES / "vllm_docs" / "command_lines.txt"
NOT_TAKEN = {  # vLLM flags in those lines that llmctl does not take, the command they belong to, and why
    "--custom-skip-chat-template": ("bench", "llmctl's custom dataset never applies a chat template, so there is "
                                             "nothing to skip"),
    "--hf-config-path": ("serve", "llmctl reads a GGUF's config from the file itself (or its folder's config.json)"),
    "--kv-cache-dtype-skip-layers": ("serve", "llmctl's fp8 KV cache covers every layer or none"),
    **{flag: ("serve", "llmctl runs TP x PP across nodes under torchrun or Ray (docs/parallel.md), not vLLM's "
                       "per-node launches") for flag in ("--nnodes", "--node-rank", "--master-addr", "--headless")},
    **{flag: ("serve", "llmctl spreads --dp replicas across nodes with --data-parallel-backend ray from one "
                       "command, not vLLM's per-node DP launches") for flag in (
        "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port",
        "--data-parallel-start-rank", "--data-parallel-rank")},
    "--default_mm_loras": ("serve", "llmctl serves no audio models, which those default adapters are for"),
    "--task": ("serve", "vLLM's older flag: llmctl takes vLLM's current --runner pooling --convert embed"),
}


def vllm_lines() -> list[list[str]]:
    lines = [line for line in LINES.read_text().splitlines() if line.startswith("vllm ")]
    return [shlex.split(line)[1:] for line in lines]


def without_not_taken(args: list[str]) -> list[str]:
    """The line without the flags llmctl does not take, and their values."""
    kept, skipping = [], False
    for arg in args:
        if arg.startswith("-"):
            skipping = arg.split("=")[0] in NOT_TAKEN
        if not skipping:
            kept.append(arg)
    return kept


@pytest.mark.parametrize("args", vllm_lines(), ids=lambda args: " ".join(args)[:60])
def test_vllm_docs_command_lines_parse(args: list[str]) -> None:
    params = parse(spread_multi_values(without_not_taken(args)))
    if args[0] == "bench":
        endpoint = resolve_endpoint(params["endpoint"], params["backend"])
        assert (endpoint.kind, endpoint.path) == ("completions", "/v1/completions")
        assert params["base_url"] is None and params["host"] == "127.0.0.1"  # vLLM's defaults


def test_forty_lines_from_vllms_docs() -> None:
    assert len(vllm_lines()) >= 40


def test_the_values_are_vllms() -> None:
    [bench] = [a for a in vllm_lines() if "--goodput" in a]
    assert list(parse(spread_multi_values(bench))["goodput"]) == ["ttft:500", "tpot:50", "e2el:2000"]
    [serve] = [a for a in vllm_lines() if "--kv-cache-memory-bytes" in a]
    params = parse(serve)
    assert params["tensor_parallel_size"] == 2
    assert parse_bytes(params["kv_cache_memory"], "--kv-cache-memory-bytes") == 4 * 1024**3  # vLLM: G = 2^30
    assert parse_bytes("4g", "--kv-cache-memory-bytes") == 4 * 10**9  # and g = 10^9
    assert parse_origins(params["allowed_origins"]) == ["https://a.example", "https://b.example"]
    # --max-model-len's help text in vllm/engine/arg_utils.py: "1k -> 1000, 1K -> 1024, 25.6k -> 25,600"
    assert [parse_count(v, "--max-model-len") for v in ("1k", "1K", "25.6k", "4096")] == [1000, 1024, 25600, 4096]
    assert parse(["serve", "m", "--max-model-len", "32K"])["max_model_len"] == "32K"  # parsed as above
    [custom] = [a for a in vllm_lines() if "custom" in a]
    params = parse(without_not_taken(custom))
    assert (params["port"], params["top_p"], params["temperature"]) == (9001, 0.75, 0.3)


@pytest.mark.parametrize("flag", sorted(NOT_TAKEN))
def test_a_vllm_flag_llmctl_does_not_take_is_refused_by_name(flag: str) -> None:
    command = ["bench", "serve"] if NOT_TAKEN[flag][0] == "bench" else ["serve"]
    with pytest.raises(Exception, match=f"No such option.*{flag}") as refused:
        parse([*command, flag])
    assert type(refused.value).__name__ == "NoSuchOption"


def test_backends_and_endpoints_resolve_as_vllm_pairs_them() -> None:
    assert resolve_endpoint("/v1/chat/completions", "openai-chat").path == "/v1/chat/completions"
    assert resolve_endpoint(None, "openai-chat").kind == "chat"
    assert resolve_endpoint("/api/v1/completions", "openai").path == "/api/v1/completions"
    assert resolve_endpoint("chat", None).path == "/v1/chat/completions"  # llmctl's short name stays
    with pytest.raises(Exception, match="--backend openai-chat calls the chat API"):
        resolve_endpoint("/v1/completions", "openai-chat")
    with pytest.raises(Exception, match="--backend tgi: llmctl benchmarks OpenAI-compatible APIs"):
        resolve_endpoint(None, "tgi")
    assert resolve_endpoint("/v1/embeddings", "openai-embeddings").kind == "embeddings"
    assert resolve_endpoint("/v1/rerank", "vllm-rerank").kind == "rerank"  # vLLM's pair for rerankers
    with pytest.raises(Exception, match="must end in /completions, /chat/completions, /embeddings or /rerank"):
        resolve_endpoint("/v1/score", None)


def test_served_model_names_run_to_the_next_option_as_vllms_nargs() -> None:
    args = ["serve", "org/model", "--served-model-name", "a", "b", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem",
            "--ssl-cert-reqs", "2", "--root-path", "/llm", "--uds", "/tmp/llm.sock", "--metrics-prefix", "vllm"]
    params = parse(spread_multi_values(args))
    assert params["model"] == "org/model" and list(params["served_model_name"]) == ["a", "b"]  # a tuple in click 8.1
    assert (params["ssl_certfile"], params["ssl_keyfile"], params["ssl_cert_reqs"]) == ("c.pem", "k.pem", 2)
    assert (params["root_path"], params["uds"], params["metrics_prefix"]) == ("/llm", "/tmp/llm.sock", "vllm")
    # bench serve's --served-model-name is one name, as in vLLM's bench
    bench = ["bench", "serve", "--served-model-name", "a", "b"]
    assert spread_multi_values(bench) == bench


def test_every_boolean_flag_of_serve_has_vllms_no_form() -> None:
    """vLLM's argparse makes each boolean a BooleanOptionalAction: --x and --no-x."""
    import typer

    from llmctl.cli import app

    serve = typer.main.get_command(app).get_command(None, "serve")  # type: ignore[union-attr]
    booleans = [option for option in serve.params if getattr(option, "is_flag", False) and option.name != "help"]
    assert len(booleans) >= 12
    for option in booleans:
        assert option.secondary_opts == [option.opts[0].replace("--", "--no-", 1)], option.opts
        on, off = parse(["serve", "m", option.opts[0]]), parse(["serve", "m", option.secondary_opts[0]])
        assert on[option.name] is True and off[option.name] is False
