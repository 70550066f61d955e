#!/usr/bin/env bash
# The GPU checks in one command, on a machine with a CUDA GPU and llmctl installed (docs/kernels.md): first the
# decode workload end to end in under 5 minutes (benchmarks/gpu_step_profile.py: TPOT beside its bandwidth floor,
# kernels per step, host against device time), then the ahead-of-time compile check for this GPU's arch, the kernel benchmarks, the W4A16 tile sweep and the decode GEMV's, an end-to-end `bench offline` with and without CUDA graphs, and the GPU test subset
# (compiled Triton kernels incl. the fused-MoE GEMM, CUDA graphs, the measured activation peak). Everything lands in
# ${GPU_CHECK_OUT:-gpu-check} (logs, and gpu-check.json with every figure); the exit status is the tests'.
#
#   scripts/gpu-check.sh            # all of it (the end-to-end run builds a 16 GB random Llama-3-8B first)
#   GPU_CHECK_SKIP_E2E=1 scripts/gpu-check.sh
#   GPU_CHECK_PARTS="gemv kernels" scripts/gpu-check.sh   # some parts, in this order (one device call is 10 minutes)
# Parts: step compile kernels tiles gemv e2e tests (the default: all, in that order; GPU_CHECK_SKIP_* still skip).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT_DIR="${GPU_CHECK_OUT:-gpu-check}"
mkdir -p "$OUT_DIR"
OUT_ABS=$(cd "$OUT_DIR" && pwd)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
"$PYTHON" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT_DIR/gpu.txt"

[ -n "${GPU_CHECK_SKIP_COMPILE:-}" ] && export GPU_CHECK_SKIP_compile=1
[ -n "${GPU_CHECK_SKIP_E2E:-}" ] && export GPU_CHECK_SKIP_e2e=1
tests=0
for part in ${GPU_CHECK_PARTS:-step compile kernels tiles gemv e2e tests}; do
    skip="GPU_CHECK_SKIP_$part"
    [ -n "${!skip:-}" ] && continue
    case "$part" in
    step)  # end to end first: the figure the issue's bar is about, kept even if a later part runs out of time
        (cd benchmarks && timeout "${GPU_CHECK_STEP_TIMEOUT:-300}" "$PYTHON" gpu_step_profile.py \
            --json "$OUT_ABS/step_profile.json") 2>&1 | tee "$OUT_DIR/step_profile.log" ;;
    compile)  # every kernel case compiled for this GPU's arch, as CI does for sm_80/89/90
        ARCH=$("$PYTHON" -c 'import torch; m, n = torch.cuda.get_device_capability(); print(10 * m + n)')
        timeout "${GPU_CHECK_COMPILE_TIMEOUT:-300}" "$PYTHON" -m llmctl.kernels.compile_check --arch "$ARCH" \
            --workers 8 2>&1 | grep -v FP_FUSION | tee "$OUT_DIR/compile_check.log" ;;
    kernels)
        timeout "${GPU_CHECK_KERNELS_TIMEOUT:-600}" "$PYTHON" benchmarks/kernels.py --json "$OUT_DIR/kernels.json" 2>&1 \
            | tee "$OUT_DIR/kernels.log" ;;
    tiles)
        timeout "${GPU_CHECK_TILES_TIMEOUT:-300}" "$PYTHON" benchmarks/w4a16_tiles.py --json "$OUT_DIR/w4a16_tiles.json" \
            2>&1 | grep -v "^    " | tee "$OUT_DIR/w4a16_tiles.log" ;;
    gemv)
        timeout "${GPU_CHECK_GEMV_TIMEOUT:-420}" "$PYTHON" benchmarks/w4a16_gemv.py --json "$OUT_DIR/w4a16_gemv.json" \
            2>&1 | tee "$OUT_DIR/w4a16_gemv.log" ;;
    e2e)
        timeout "${GPU_CHECK_E2E_TIMEOUT:-900}" "$PYTHON" benchmarks/gpu_end_to_end.py --json "$OUT_DIR/end_to_end.json" \
            2>&1 | tee "$OUT_DIR/end_to_end.log" ;;
    tests)
        timeout "${GPU_CHECK_TEST_TIMEOUT:-900}" "$PYTHON" -m pytest -v -n 0 -p no:cacheprovider -rfEs \
            tests/kernels/test_kernels.py tests/kernels/test_fp8_w8a16.py \
            tests/engine/models/test_moe.py::test_fused_moe_kernel_equals_the_grouped_experts \
            tests/engine/models/test_moe.py::test_fused_moe_kernel_runs_stacked_experts_as_their_grouped_path \
            tests/engine/worker/test_gpu_memory_budget.py tests/engine/models/test_engine_models.py \
            tests/engine/lora/test_lora.py::test_adapters_through_the_cuda_graph_buffers_equal_transformers_with_peft \
            tests/engine/models/test_mamba2.py::test_mamba2_decodes_through_the_cuda_graph_buffers \
            tests/engine/worker/test_kv_offload.py tests/engine/spec_decode/test_eagle.py \
            tests/engine/spec_decode/test_eagle3.py::test_first_drafts_equal_eagle3_computed_from_its_definition 2>&1 | tee "$OUT_DIR/tests.log"
        tests=${PIPESTATUS[0]} ;;
    *) echo "gpu-check: no part named '$part' (parts: step compile kernels tiles gemv e2e tests)" >&2; exit 2 ;;
    esac
done
"$PYTHON" - "$OUT_DIR" "$tests" <<'PY'
import json, sys
from pathlib import Path
out, tests = Path(sys.argv[1]), int(sys.argv[2])
read = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else None
summary = {"gpu": (out / "gpu.txt").read_text().strip(), "tests_exit_status": tests,
           "tests_summary": (out / "tests.log").read_text().strip().splitlines()[-1:] if (out / "tests.log").exists() else [],
           "kernels": read("kernels.json"), "w4a16_tiles": read("w4a16_tiles.json"), "w4a16_gemv": read("w4a16_gemv.json"), "end_to_end": read("end_to_end.json"),
           "step_profile": read("step_profile.json")}
(out / "gpu-check.json").write_text(json.dumps(summary, indent=1))
print(f"wrote {out / 'gpu-check.json'}")
PY
exit "$tests"
