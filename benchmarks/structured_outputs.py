"""The cost of structured outputs: `llmctl bench offline` on the default model with and without
`--json-schema`, runs alternating so that machine noise spreads over both; prints each side's median
output tok/s and the ratio (issue 35's bar: the constrained run within 15 % of the unconstrained one).

The schema asks for a string of at least 2,000 characters, so every request stays inside the grammar
for all its tokens (a schema it could finish would leave the rest of an ignore_eos run unconstrained).

    python benchmarks/structured_outputs.py [--runs 3] [--num-prompts 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 2000}}, "required": ["story"]}


def run(extra: list[str], prompts: int) -> float:
    command = [sys.executable, "-m", "llmctl", "bench", "offline", "--num-prompts", str(prompts),
               "--random-input-len", "128", "--random-output-len", "64", "--json", *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["llmctl"]["output_tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    args = parser.parse_args()
    sides = {"unconstrained": [], "json schema": []}
    for _ in range(args.runs):
        sides["unconstrained"].append(run([], args.num_prompts))
        sides["json schema"].append(run(["--json-schema", json.dumps(SCHEMA)], args.num_prompts))
    medians = {name: statistics.median(values) for name, values in sides.items()}
    for name, values in sides.items():
        print(f"{name:14s} median {medians[name]:7.1f} output tok/s  runs {', '.join(f'{v:.1f}' for v in values)}")
    print(f"ratio (json schema / unconstrained): {medians['json schema'] / medians['unconstrained']:.2f}")


if __name__ == "__main__":
    main()
