"""A bug of llmctl's at `serve` startup is reported as an internal error (exit 3), never as the user's
mistake (exit 2), in one process and in a worker rank; LLMCTL_DEBUG=1 shows its traceback.

The bug is injected through a sitecustomize.py on PYTHONPATH, which every process (spawned ranks too)
runs before llmctl: it breaks one function of the loader with a ZeroDivisionError."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli_process import run_cli
from helpers.server_helpers import free_port

pytestmark = pytest.mark.subprocess

INJECTED = '''
import multiprocessing
import os


where = os.environ.get("LLMCTL_TEST_BUG_IN")  # "every" process, or only "workers"
if where:
    import llmctl.engine.worker.loader as loader

    original = loader._check_native

    def _check_native(*args, **kwargs):
        if where == "every" or multiprocessing.current_process().name != "MainProcess":
            raise ZeroDivisionError("injected bug")
        return original(*args, **kwargs)

    loader._check_native = _check_native
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_source) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("bugs") / "tiny"
    AutoTokenizer.from_pretrained(str(default_source.path)).save_pretrained(folder)
    LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)).save_pretrained(folder)
    (folder.parent / "sitecustomize.py").write_text(INJECTED)
    return folder


def serve_with_bug(tiny: Path, where: str, *flags: str, debug: bool = False):
    env = {"PYTHONPATH": str(tiny.parent), "LLMCTL_TEST_BUG_IN": where, "LLMCTL_DEBUG": "1" if debug else "0"}
    return run_cli("serve", str(tiny), "--port", str(free_port()), *flags, env=env, timeout=240)


@pytest.mark.parametrize("where, flags, names", [("every", (), "ZeroDivisionError: injected bug"),
                                                 ("workers", ("--tp", "2"), "rank 1: ZeroDivisionError")])
def test_a_startup_bug_is_an_internal_error_with_its_traceback_on_demand(tiny, where, flags, names) -> None:
    plain = serve_with_bug(tiny, where, *flags)
    assert plain.returncode == 3, plain.stderr
    assert "internal error" in plain.stderr and names in plain.stderr and "LLMCTL_DEBUG=1" in plain.stderr
    assert "Traceback" not in plain.stderr

    debug = serve_with_bug(tiny, where, *flags, debug=True)
    assert debug.returncode != 2, debug.stderr
    assert "Traceback (most recent call last)" in debug.stderr and "in _check_native" in debug.stderr
    assert names in debug.stderr


def test_a_users_mistake_at_startup_stays_one_line_with_exit_2(tiny) -> None:
    result = run_cli("serve", str(tiny), "--port", str(free_port()), "--tp", "3")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("error:") == 1


NO_MAIN_GUARD = '''
from llmctl import LLM

LLM({folder!r}, tensor_parallel_size=2, max_model_len=64, kv_cache_memory=16 << 20)
print("engine up")
'''


def test_workers_that_die_at_bootstrap_fail_the_driver_at_once_with_advice(tiny, tmp_path) -> None:
    """A script without `if __name__ == "__main__":` makes every spawned rank fail while it bootstraps; the
    driver waited in the ranks' rendezvous until killed (> 300 s). It must stop and say what to do."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(NO_MAIN_GUARD.format(folder=str(tiny)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150)
    assert result.returncode != 0 and "engine up" not in result.stdout
    assert 'if __name__ == "__main__":' in result.stderr and "llmctl-rank1 exited" in result.stderr, result.stderr


def quantized_copy(tiny: Path, folder: Path, quantization_config: dict) -> Path:
    """The tiny model with its linear weights in float8 e4m3 and block scales (DeepSeek-V3's and the Qwen3 -FP8
    layout: `weight_scale_inv` per 128 × 128 block) under the given quantization_config."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny, folder)
    tensors = load_file(folder / "model.safetensors")
    for name in [n for n in tensors if n.endswith("proj.weight")]:
        weight = tensors[name]
        tensors[name] = weight.to(torch.float8_e4m3fn)
        blocks = (-(-weight.shape[0] // 128), -(-weight.shape[1] // 128))
        tensors[name.removesuffix("weight") + "weight_scale_inv"] = torch.ones(blocks)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    return folder


@pytest.mark.parametrize("quantization_config, message", [
    ({"quant_method": "hqq", "nbits": 4}, "quant_method 'hqq' is not supported (llmctl serves GPTQ, AWQ, GGUF, FP8"),
    ({"quant_method": "compressed-tensors", "format": "sparse-24-bitmask", "config_groups": {}},
     "compressed-tensors format 'sparse-24-bitmask' is not read yet"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}},
     "has no config_groups"),
])
def test_a_quantized_format_not_served_is_named_not_called_corrupt(tiny, tmp_path, quantization_config,
                                                                   message) -> None:
    from llmctl import LLM
    from llmctl.errors import UnsupportedModelError

    folder = quantized_copy(tiny, tmp_path / "copy", quantization_config)
    with pytest.raises(UnsupportedModelError) as error:
        LLM(str(folder), max_model_len=64, kv_cache_memory=16 << 20)
    assert message in str(error.value)
    assert "do not match" not in str(error.value)


def test_block_fp8_whose_blocks_overhang_the_weights_loads(tiny, tmp_path) -> None:
    """The file that was called corrupt (128 × 128 blocks over 64-wide weights): served now."""
    from llmctl import LLM, SamplingParams

    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    llm = LLM(str(quantized_copy(tiny, tmp_path / "fp8", fp8)), max_model_len=64, kv_cache_memory=16 << 20)
    assert len(llm.generate(["Hello"], SamplingParams(max_tokens=4, ignore_eos=True))[0].outputs[0].token_ids) == 4
