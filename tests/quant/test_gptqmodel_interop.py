"""GPTQ and AWQ folders cross-checked with gptqmodel (ModelCloud's maintained successor of auto-gptq and
autoawq), a reader and writer nobody here wrote:

- what `llmctl quantize` writes, gptqmodel loads unchanged (its torch CPU kernels through transformers),
  and its greedy tokens, log-probabilities and perplexity agree with llmctl's engine on the same folder;
- what gptqmodel writes — GPTQ with act-order (desc_act, g_idx permuted on disk) and AWQ GEMM — llmctl's
  engine loads and runs with gptqmodel's own tokens and log-probabilities.

gptqmodel runs in a subprocess (tests/helpers/gptqmodel_reference.py) in its own venv (.venv-gptqmodel, made by
scripts/setup.sh, layered over .venv: beside peft it would make peft demand optimum); it loads only as float16 on a CPU and is
then widened to float32, the engine's dtype, so the two agree to about 1e-3 in log-probability."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from helpers.cli_process import run_cli
from helpers.paths import FIXTURES, ROOT, TESTS

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

DATA = FIXTURES / "data"
WIKITEXT = DATA / "wikitext-2-raw-test.hfdatasets-derived.crlf.txt"
REFERENCE = TESTS / "helpers" / "gptqmodel_reference.py"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, default_source) -> Path:
    """A 2-layer Llama with the default model's real tokenizer; larger-than-default random weights so the
    next-token distributions are peaked enough for greedy choices to mean something."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("interop") / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.08, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


GPTQMODEL_PYTHON = ROOT / ".venv-gptqmodel" / "bin" / "python"  # scripts/setup.sh


class Reference:
    """One gptqmodel process for the module (`gptqmodel_reference.py serve`; its import alone takes ~10 s): a
    request line in, a result line out."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile("w+")  # its stderr: a file, so that a full pipe cannot stall it

    def ask(self, *args: str, request: dict | list) -> dict | list:
        if self.process is None:
            assert GPTQMODEL_PYTHON.exists(), "run ./scripts/setup.sh: it makes .venv-gptqmodel, GPTQModel's own venv"
            env = {"GPTQMODEL_CPU_WORKERS": "2", **os.environ, "PYTHONPATH": str(ROOT)}  # its loader's pool: two
            self.process = subprocess.Popen([str(GPTQMODEL_PYTHON), str(REFERENCE), "serve"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"argv": list(args), "request": request}) + "\n")
        self.process.stdin.flush()
        for line in self.process.stdout:  # its own prints (progress) come first
            if line.startswith(("RESULT ", "ERROR ")):
                kind, payload = line.split(" ", 1)
                assert kind == "RESULT", json.loads(payload)
                return json.loads(payload)
        self.log.seek(0)
        raise AssertionError(f"gptqmodel's process ended: {self.log.read()[-3000:]}")

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()  # type: ignore[union-attr]
            self.process.wait(timeout=60)
        self.log.close()


REFERENCE_PROCESS = Reference()


@pytest.fixture(scope="module", autouse=True)
def reference_process():
    yield
    REFERENCE_PROCESS.close()


def gptqmodel(*args: str, request: dict | list) -> dict | list:
    return REFERENCE_PROCESS.ask(*args, request=request)


def eval_text() -> str:
    lines = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line) > 300]
    return lines[5][:600]


def assert_engine_agrees_with_gptqmodel(folder: Path) -> str:
    """llmctl's greedy continuation and prompt perplexity vs gptqmodel's forward on the same folder;
    returns the gptqmodel kernel that ran."""
    from llmctl import LLM, SamplingParams

    llm = LLM(str(folder), max_model_len=512)
    tokenizer = llm.get_tokenizer()
    prompt_ids = tokenizer(PROMPT).input_ids
    ours = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0))[0]
    tokens = list(ours.outputs[0].token_ids)
    text_ids = tokenizer(eval_text()).input_ids
    scored = llm.generate({"prompt_token_ids": text_ids},
                          SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))[0]
    theirs, their_text = gptqmodel("score", str(folder), request=[
        {"ids": prompt_ids + tokens, "start": len(prompt_ids)}, {"ids": text_ids, "start": 1}])

    for token, mine, their_lp, their_best, margin in zip(tokens, ours.outputs[0].logprobs, theirs["logprobs"],
                                                         theirs["argmax"], theirs["margin"]):
        assert abs(mine.logprob - their_lp) < 0.03, (mine.logprob, their_lp)
        if margin > 0.03:  # float noise cannot flip a choice with this much room
            assert token == their_best
    assert sum(t == b for t, b in zip(tokens, theirs["argmax"])) >= len(tokens) - 1

    our_nll = -sum(lp.logprob for lp in scored.prompt_logprobs[1:]) / (len(text_ids) - 1)
    their_nll = -sum(their_text["logprobs"]) / (len(text_ids) - 1)
    assert math.exp(our_nll) == pytest.approx(math.exp(their_nll), rel=0.01)
    return theirs["kernel"]


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_loads_what_llmctl_quantize_writes(tiny_model: Path, tmp_path: Path, method: str) -> None:
    out = tmp_path / f"tiny-{method}"
    result = run_cli("quantize", str(tiny_model), f"--{method}", "--group-size", "32", "--calib-file",
                     str(WIKITEXT), "--calib-samples", "8", "--calib-seq-len", "64", "--no-redistribute",
                     "-o", str(out))
    assert result.returncode == 0, result.stderr
    kernel = assert_engine_agrees_with_gptqmodel(out)
    assert kernel == {"gptq": "TorchLinear", "awq": "AwqTorchLinear"}[method]  # gptqmodel's own unpacking


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_llmctl_serves_what_gptqmodel_writes(tiny_model: Path, tmp_path: Path, method: str) -> None:
    from safetensors import safe_open

    out = tmp_path / f"gptqmodel-{method}"
    texts = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line) > 300][:16]
    gptqmodel("quantize", str(tiny_model), str(out), method, request={"texts": texts})
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == method
    if method == "gptq":
        assert config["desc_act"] is True
        with safe_open(out / "model.safetensors", "pt") as f:
            g_idx = f.get_tensor("model.layers.0.mlp.down_proj.g_idx")
        assert (g_idx.diff() < 0).any()  # really permuted: the act-order path, not the trivial one
    assert_engine_agrees_with_gptqmodel(out)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory, default_source) -> Path:
    """A 2-layer Qwen3-MoE (4 experts, 2 per token) with the default model's tokenizer."""
    from transformers import AutoTokenizer, Qwen3MoeConfig

    from helpers.models import save_random_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_source.path))
    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                            moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=32, initializer_range=0.08,
                            max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    return save_random_model(config, tmp_path_factory.mktemp("interop-moe") / "base", tokenizer)


def test_llmctl_serves_a_mixture_of_experts_gptqmodel_writes(tiny_moe: Path, tmp_path: Path) -> None:
    """A Qwen3-MoE quantized by gptqmodel expert by expert (GPTQ in order, as published MoE checkpoints are):
    llmctl keeps its experts 4-bit on the CPU int4 kernel and agrees with gptqmodel's own forward."""
    from safetensors import safe_open

    from llmctl import LLM
    from llmctl.engine.layers.moe import FusedMoE

    out = tmp_path / "gptqmodel-moe"
    texts = [line for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line) > 300][:16]
    gptqmodel("quantize", str(tiny_moe), str(out), "gptq-in-order", request={"texts": texts})
    with safe_open(out / "model.safetensors", "pt") as stored:  # every expert packed by gptqmodel itself
        assert {f"model.layers.1.mlp.experts.{e}.down_proj.qweight" for e in range(4)} <= set(stored.keys())
    layers = [m for m in LLM(str(out), max_model_len=128).engine.executor.loaded.model.modules()
              if isinstance(m, FusedMoE)]
    assert layers and all(m.coded is not None and m.nbytes > 0 for m in layers)
    assert_engine_agrees_with_gptqmodel(out)


def test_gptqmodel_loads_a_mixture_of_experts_llmctl_quantize_writes(tiny_moe: Path, tmp_path: Path) -> None:
    """`llmctl quantize --gptq` on a Qwen3-MoE (experts quantized one by one on the tokens routed to them):
    gptqmodel loads the folder unchanged and its forward agrees with llmctl's engine."""
    out = tmp_path / "llmctl-moe"
    result = run_cli("quantize", str(tiny_moe), "--gptq", "--group-size", "32", "--calib-file", str(WIKITEXT),
                     "--calib-samples", "8", "--calib-seq-len", "64", "--no-redistribute", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert assert_engine_agrees_with_gptqmodel(out) == "TorchLinear"
