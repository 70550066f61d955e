"""Chat template resolution order and tokenizer facts from config files only."""

from __future__ import annotations

import json
from pathlib import Path

from llmctl.checkpoint.source import resolve_model
from llmctl.checkpoint.tokenizer import builtin_template, resolve_chat_template, tokenizer_facts


def folder_with(tmp_path: Path, files: dict[str, str]) -> Path:
    tmp_path.joinpath("config.json").write_text(json.dumps({"model_type": "llama"}))
    for name, text in files.items():
        tmp_path.joinpath(name).write_text(text)
    return tmp_path


def test_named_templates_in_tokenizer_config(tmp_path: Path) -> None:
    templates = [{"name": "default", "template": "{{ 'd' }}"}, {"name": "tool_use", "template": "{{ 't' }}"}]
    source = resolve_model(str(folder_with(tmp_path, {"tokenizer_config.json": json.dumps({"chat_template": templates})})))
    template = resolve_chat_template(source, "llama")
    assert template.text == "{{ 'd' }}" and template.names == ("default", "tool_use")


def test_jinja_file_then_json_file_then_builtin(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    jinja = folder_with(tmp_path / "a", {"chat_template.jinja": "J", "chat_template.json": '{"chat_template": "X"}'})
    assert resolve_chat_template(resolve_model(str(jinja)), "llama").source == "chat_template.jinja"
    (tmp_path / "b").mkdir()
    as_json = folder_with(tmp_path / "b", {"chat_template.json": '{"chat_template": "X"}'})
    assert resolve_chat_template(resolve_model(str(as_json)), "llama").text == "X"
    (tmp_path / "c").mkdir()
    bare = resolve_model(str(folder_with(tmp_path / "c", {})))
    bloom = resolve_chat_template(bare, "bloom")
    assert bloom.source == "llmctl templates/bloom.jinja" and bloom.text == builtin_template("bloom")
    assert resolve_chat_template(bare, "llama").text is None


def test_bloom_template_renders() -> None:
    from jinja2 import Template

    text = Template(builtin_template("bloom")).render(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, eos_token="</s>")
    assert text == "Be brief.\n\nUser: Hi\nAssistant:"


def test_facts_from_config_files_when_no_tokenizer_files(tmp_path: Path) -> None:
    source = resolve_model(str(folder_with(tmp_path, {
        "tokenizer_config.json": json.dumps({"tokenizer_class": "LlamaTokenizer", "model_max_length": 4096}),
        "special_tokens_map.json": json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "</s>"}),
    })))
    facts = tokenizer_facts(source, "llama", 32000)
    assert not facts.loaded and facts.vocab_size == 32000 and facts.vocab_source == "config.json vocab_size"
    assert facts.special_tokens["bos_token"] == "<s>" and facts.special_tokens["eos_token"] == "</s>"
    assert facts.model_max_length == 4096 and "no tokenizer files" in facts.note
