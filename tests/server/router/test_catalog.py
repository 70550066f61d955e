"""What `--models` values name, and which of the command line's flags every routed model's server gets."""

from __future__ import annotations

import pytest

from llmctl.errors import LlmctlError
from llmctl.server.router.catalog import RoutedModel, parse_models
from llmctl.server.router.run import shared_flags


def test_name_path_flags_adapters_and_folders(tmp_path):
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()  # no model in it
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    models = parse_models(["chat=./m --max-model-len 512 --enable-lora --lora-modules a=./a b=./b", "smol=",
                           str(tmp_path)])
    assert models == [
        RoutedModel("chat", "./m", ("--max-model-len", "512", "--enable-lora", "--lora-modules", "a=./a", "b=./b"),
                    ("a", "b")),
        RoutedModel("smol", ""), RoutedModel("qwen", str(tmp_path / "qwen")), RoutedModel("tiny", str(tmp_path / "tiny.gguf"))]


@pytest.mark.parametrize(("values", "says"), [
    (["a=./x", "a=./y"], "repeated: a"),
    (["a=./x --lora-modules a=./l"], "repeated: a"),
    (["=./x"], "use NAME=PATH"),
    (["a=./x --port 9"], "the router's"),
    (["./no-such-folder"], "neither NAME=PATH nor a folder"),
])
def test_bad_values_say_what_to_do(values, says):
    with pytest.raises(LlmctlError, match=says):
        parse_models(values)


def test_the_routers_own_flags_stay_with_the_router():
    argv = ["/x/llmctl", "serve", "--models", "a=./a", "--max-loaded-models=2", "--port", "8000", "--dtype", "half",
            "--host=0.0.0.0", "--models", "b=./b", "--ssl-keyfile", "k.pem", "--max-model-len", "128"]
    assert shared_flags(argv) == ("--dtype", "half", "--max-model-len", "128")
