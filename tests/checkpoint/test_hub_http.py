"""The real huggingface_hub code path against a hub-like server on 127.0.0.1: remote
safetensors headers by HTTP range requests (no weights downloaded), gated and missing repos."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from helpers.cli_process import run_cli
from helpers.fake_hub import FakeHub, FakeRepo
from helpers.paths import FIXTURES

pytestmark = pytest.mark.subprocess

WEIGHTS = {
    "model.embed_tokens.weight": torch.zeros(1000, 256),
    "model.layers.0.self_attn.q_proj.weight": torch.zeros(256, 256),
    "model.layers.0.self_attn.k_proj.weight": torch.zeros(128, 256),
    "model.layers.0.self_attn.v_proj.weight": torch.zeros(128, 256),
    "model.layers.0.self_attn.o_proj.weight": torch.zeros(256, 256),
    "model.layers.0.mlp.gate_proj.weight": torch.zeros(512, 256),
    "model.layers.0.mlp.up_proj.weight": torch.zeros(512, 256),
    "model.layers.0.mlp.down_proj.weight": torch.zeros(256, 512),
    "model.layers.0.input_layernorm.weight": torch.zeros(256),
    "model.layers.0.post_attention_layernorm.weight": torch.zeros(256),
    "model.norm.weight": torch.zeros(256),
}
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
          "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 1000, "max_position_embeddings": 2048, "tie_word_embeddings": True,
          "torch_dtype": "float32"}


@pytest.fixture()
def hub(tmp_path: Path):
    fake = FakeHub(repos={
        "acme/tiny": FakeRepo(files={
            "config.json": json.dumps(CONFIG).encode(),
            "README.md": b"---\nlicense: apache-2.0\n---\n# tiny\n",
            "model.safetensors": save(WEIGHTS),
        }),
        "acme/gated": FakeRepo(files={}, gated=True),
        "acme/locked-weights": FakeRepo(files={"config.json": json.dumps(CONFIG).encode(),
                                               "model.safetensors": save(WEIGHTS)},
                                        failing={"model.safetensors": 401}),
    })
    url = fake.start()
    env = {"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_HUB_DISABLE_XET": "1"}
    yield fake, env
    fake.stop()


def test_remote_headers_by_range_requests_without_downloading_weights(hub) -> None:
    fake, env = hub
    result = run_cli("inspect", "acme/tiny", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    expected = sum(t.numel() for t in WEIGHTS.values())
    assert report["weights"]["origin"] == "remote headers (HTTP range requests)"
    assert report["weights"]["params_from_headers"] == expected == report["weights"]["params_from_config"]
    assert report["license"]["license"]["id"] == "apache-2.0"
    weight_gets = [(m, r) for m, p, r in fake.requests if m == "GET" and p.endswith("model.safetensors")]
    assert weight_gets and all(r is not None for _, r in weight_gets)  # only ranged reads of the header
    assert not list(Path(env["HF_HUB_CACHE"]).rglob("model.safetensors"))  # weights never reached the cache


def test_header_failures_say_what_happened_not_offline(hub) -> None:
    _, env = hub
    result = run_cli("inspect", "acme/locked-weights", "--json", env=env)
    assert result.returncode == 0, result.stderr
    note = json.dumps(json.loads(result.stdout)["weights"])
    assert "access denied reading the headers (HTTP 401)" in note and "HF_TOKEN" in note
    assert "offline" not in note


def tiny_llama(folder: Path, default_source) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    tokenizer.save_pretrained(folder)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)).save_pretrained(
        folder)
    return folder


def test_the_default_calibration_set_downloads_from_the_hub_and_works(hub, tmp_path: Path, default_source) -> None:
    import zstandard

    fake, env = hub
    wikitext = FIXTURES / "data" / "wikitext-2-raw-test.hfdatasets-derived.crlf.txt"
    lines = [json.dumps({"text": line}) for line in wikitext.read_text(encoding="utf-8").splitlines()[:400]
             if len(line) > 200]
    fake.repos["mit-han-lab/pile-val-backup"] = FakeRepo(files={
        "val.jsonl.zst": zstandard.ZstdCompressor().compress("\n".join(lines).encode())})
    folder = tiny_llama(tmp_path / "tiny", default_source)
    result = run_cli("quantize", str(folder), "--gptq", "--no-redistribute", "--calib-samples", "2",
                     "--calib-seq-len", "32", "-o", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr
    assert "calibration: 2 × 32 tokens from mit-han-lab/pile-val-backup (pileval, from the hub)" in result.stderr
    assert ("GET", "/datasets/mit-han-lab/pile-val-backup/resolve/main/val.jsonl.zst", None) in fake.requests
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_the_hub_behind_a_proxy_is_reached_through_it(hub, tmp_path: Path, default_source) -> None:
    """HF_ENDPOINT names a host with no DNS; only HTTP_PROXY (the fake hub, acting as the proxy) reaches it.
    A check that ignored the proxy would call the hub unreachable and calibrate data-free."""
    import zstandard

    fake, env = hub
    fake.repos["mit-han-lab/pile-val-backup"] = FakeRepo(files={
        "val.jsonl.zst": zstandard.ZstdCompressor().compress(b'{"text": "' + b"a b c d " * 200 + b'"}')})
    proxied = {**env, "HF_ENDPOINT": "http://hub.invalid", "HTTP_PROXY": env["HF_ENDPOINT"],
               "http_proxy": env["HF_ENDPOINT"], "NO_PROXY": "", "no_proxy": ""}
    folder = tiny_llama(tmp_path / "tiny", default_source)
    result = run_cli("quantize", str(folder), "--awq", "--no-redistribute", "--calib-samples", "1",
                     "--calib-seq-len", "32", "-o", str(tmp_path / "out"), env=proxied)
    assert result.returncode == 0, result.stderr
    assert "from mit-han-lab/pile-val-backup (pileval, from the hub)" in result.stderr
    assert "hub.invalid" in fake.hosts  # the requests named the hub and went through the proxy


def test_an_unreachable_hub_means_calibrating_on_the_models_own_samples(tmp_path: Path, default_source) -> None:
    from helpers.server_helpers import free_port

    env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0",  # nothing listens there
           "HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HUB_DISABLE_XET": "1"}
    folder = tiny_llama(tmp_path / "tiny", default_source)
    result = run_cli("quantize", str(folder), "--awq", "--no-redistribute", "--calib-samples", "2",
                     "--calib-seq-len", "32", "-o", str(tmp_path / "out"), env=env)
    assert result.returncode == 0, result.stderr
    assert "the hub cannot be reached (http://127.0.0.1:" in result.stderr and "ConnectError" in result.stderr
    assert "calibration: 2 × 32 tokens from the model's own samples (data-free)" in result.stderr
    assert "calibration" in result.stdout and "serve it: llmctl serve" in result.stdout


def test_calibration_download_failure_is_reported_as_such(hub, tmp_path: Path, default_source) -> None:
    _, env = hub
    folder = tiny_llama(tmp_path / "tiny", default_source)
    result = run_cli("quantize", str(folder), "--awq", "--no-redistribute", "-o", str(tmp_path / "out"), env=env)
    assert result.returncode == 2
    assert "downloading the default calibration set mit-han-lab/pile-val-backup failed" in result.stderr
    assert "RepositoryNotFoundError" in result.stderr and "Traceback" not in result.stderr


def test_gated_repo_is_one_line_with_what_to_do(hub) -> None:
    _, env = hub
    result = run_cli("inspect", "acme/gated", env=env)
    assert result.returncode == 2
    assert "acme/gated is gated" in result.stderr and "HF_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_repo_is_one_line_with_what_to_do(hub) -> None:
    _, env = hub
    result = run_cli("license", "acme/nothing-here", env=env)
    assert result.returncode == 2
    assert "was not found on the hub" in result.stderr and "Traceback" not in result.stderr


def test_no_network_and_no_cache(tmp_path: Path) -> None:
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "c")}
    result = run_cli("inspect", "acme/tiny", env=env)
    assert result.returncode == 2
    assert "not in the local cache" in result.stderr and "hub cannot be reached" in result.stderr


def test_default_model_comes_from_the_hub_when_reachable(tmp_path: Path) -> None:
    fake = FakeHub(repos={"HuggingFaceTB/SmolLM2-135M-Instruct": FakeRepo(files={
        "config.json": json.dumps(CONFIG).encode(), "model.safetensors": save(WEIGHTS)})})
    url = fake.start()
    try:
        env = {"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "cache"),
               "HF_HUB_DISABLE_XET": "1"}
        result = run_cli("inspect", "--json", env=env)
    finally:
        fake.stop()
    assert result.returncode == 0, result.stderr
    source = json.loads(result.stdout)["source"]
    assert source["kind"] == "hub" and source["repo_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert source["note"] is None  # not the GGUF fallback
