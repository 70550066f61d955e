"""The C++ kernels as a CPU without AVX-512 runs them, on this machine: rebuilt with LLMCTL_CPU_TARGET=haswell
(AVX2/FMA only: the AVX2 register-row attention and panel GEMM, no AVX-512 code), then the kernel tests
and the W8A8 per-token kernel tests, and the float32 engine on the AVX2 panels against transformers, in a fresh
pytest process. On a CPU without
AVX-512 the suite's own build is already that one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT, TESTS
from llmctl.kernels import cpu

pytestmark = [pytest.mark.skipif(not cpu.built_for_avx512(),
                                 reason="this CPU has no AVX-512: the suite's own kernels are the AVX2 build"),
              pytest.mark.subprocess, pytest.mark.slow]


def test_kernels_built_for_haswell_pass_the_kernel_and_avx2_engine_tests(record_property):
    tests = Path(__file__).parent
    env = {**os.environ, cpu.TARGET_ENV: "haswell"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           str(tests / "test_cpu_kernels.py"), str(tests / "test_cpu_w8a8.py"),
                           str(tests / "test_recurrent_decode.py"),
                           str(TESTS / "engine" / "models" / "test_avx2_panels_engine.py")],
                          capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT)
    summary = done.stdout.strip().splitlines()[-2:]
    record_property("ran", "haswell build: " + " | ".join(summary))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "C++ kernels without AVX-512 (LLMCTL_CPU_TARGET=haswell): the float32 panel GEMM (avx2 paths)" \
        in done.stdout
