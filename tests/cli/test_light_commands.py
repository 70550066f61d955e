"""`inspect`, `license`, `plan` and `--help` never import torch, triton or transformers' modeling code (they
answered in ~2 s, 1.6 s of it torch's import): each runs in a fresh interpreter, which then lists what it
imported. The test process itself has torch loaded, so a subprocess is the only honest place to look."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess

HEAVY = ("torch", "triton", "transformers.modeling_utils", "transformers.configuration_utils")
PROBE = """
import json, sys
sys.argv = ["llmctl", *json.loads(sys.argv[1])]
from llmctl.cli.app import main

try:
    main()
except SystemExit as exit:
    code = exit.code
print("\\nHEAVY " + json.dumps([m for m in {heavy!r} if m in sys.modules]), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [
    ["--help"], ["inspect", "--json"], ["inspect", "bigscience/bloom", "--json"], ["license", "--json"],
    ["license", "meta-llama/Llama-2-7b-hf", "--json"], ["plan", "--json"],
    ["plan", "bigscience/bloom", "--gpus", "8", "--kv-cache-dtype", "fp8", "--json"],
], ids=lambda args: " ".join(args))
def test_light_commands_import_no_torch(args: list[str], default_source) -> None:  # converted once, before
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), json.dumps(args)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "HEAVY " in result.stderr, result.stderr
    assert json.loads(result.stderr.split("HEAVY ")[-1]) == [], result.stderr
    assert "Traceback" not in result.stderr and result.stdout.strip(), result.stderr
