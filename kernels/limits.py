"""What llmctl's Triton kernels support: the cache block sizes, and what each NVIDIA GPU can run
(its shared memory, fp8). No triton import here: the engine's config reads it on any machine.

`llmctl.kernels.compile_check` compiles every kernel case for sm_80, sm_89 and sm_90 and checks
that what fails to compile is exactly what `kernel_refusal` refuses here.
"""

from __future__ import annotations

SUPPORTED_BLOCK_SIZES = (8, 16, 32, 64)  # tokens per KV cache block (--block-size)

# The most shared memory one program may use (the opt-in limit per block), by compute capability.
SHARED_MEMORY_BYTES = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
SMALLEST_SHARED_MEMORY = min(SHARED_MEMORY_BYTES.values())  # tiles are chosen to fit every target
OLDER_GPU_SHARED_MEMORY = 65_536  # sm_75 (Turing); newer unknown GPUs are taken as sm_89's
FP8_FROM_ARCH = 89  # tl.float8e4nv (e4m3) exists from Ada (sm_89) on
MIN_KEY_TILE = 16
# The fused norm holds a row in one program (64 floats a thread at 4 warps): wider rows keep the torch form.
MAX_FUSED_WIDTH = 8192

# The C++ CPU attention kernel: new tokens per sequence up to which it attends, SDPA above (measured by
# benchmarks/cpu_attention.py --prompts): with rows in AVX-512 registers, fresh prompts included (in 16-bit
# types only up to 64: past that torch's bfloat16 SDPA won on a Sapphire Rapids Xeon, 1.2-1.9x at 96-192
# tokens); with its plain loop (no AVX-512, odd head sizes), only chunks over cached tokens.
VECTOR_QUERY_LIMIT = 256
HALF_VECTOR_QUERY_LIMIT = 64
SHORT_QUERY_LIMIT = 16


def attention_shared_bytes(padded_dim: int, rows: int, key_tile: int, element_bytes: int) -> int:
    """An upper bound on one attention program's shared memory under Triton 3.9: the query tile, a key
    and a value tile staged for tl.dot, the score tile of float32 pipelines, and a little for barriers
    (fitted to what the compile check measures: exact for float32, above it for 16-bit types)."""
    return element_bytes * (padded_dim * (rows + 2 * key_tile) + rows * key_tile) + 1024


def shared_memory_limit(arch: int) -> int:
    return SHARED_MEMORY_BYTES.get(arch, OLDER_GPU_SHARED_MEMORY if arch < 80 else SMALLEST_SHARED_MEMORY)


def kernel_refusal(arch: int, dtype: str, kv_dtype: str, padded_dim: int = 0, rows: int = 0) -> str | None:
    """One line saying why this GPU cannot run the kernels for these settings; None when it can."""
    if kv_dtype == "fp8e4nv" and arch < FP8_FROM_ARCH:  # e5m2 (fp8e5) compiles for sm_80 too
        return (f"--kv-cache-dtype fp8 needs a GPU of compute capability 8.9 or newer (Ada, Hopper) for e4m3; "
                f"this one is {arch // 10}.{arch % 10}: use --kv-cache-dtype fp8_e5m2 or auto")
    element_bytes = 4 if dtype == "fp32" else 2
    if attention_shared_bytes(padded_dim, rows, MIN_KEY_TILE, element_bytes) > shared_memory_limit(arch):
        return (f"--dtype float32: attention over {rows} query rows of head dim {padded_dim} needs more shared memory "
                f"than compute capability {arch // 10}.{arch % 10} has: use --dtype bfloat16")
    return None
