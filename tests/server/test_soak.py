"""benchmarks/soak.py in its short mode: overload is refused with 503, nothing fails, nothing leaks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.paths import ROOT

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

SOAK = ROOT / "benchmarks" / "soak.py"


def test_short_soak_at_twice_capacity(default_source):
    result = subprocess.run([sys.executable, str(SOAK), "--minutes", "0.4", "--max-num-seqs", "4",
                             "--max-queue-len", "2", "--input-len", "32", "--output-len", "12"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    report = dict(line.split("  ", 1) for line in result.stdout.splitlines() if "  " in line)
    assert report["failed (must be 0)"].strip() == "0"
    assert int(report["completed"]) + int(report["refused with 503 (queue limit)"]) == int(report["requests sent"])
    assert report["KV cache in use at the end"].strip().startswith("0.0 %")
