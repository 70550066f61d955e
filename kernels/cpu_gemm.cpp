// float32 linears on AVX-512 CPUs: y = x Wᵀ (+ b), over a weight packed once into column panels.
//
// Why our own: at decoding's batch sizes (one to a few dozen rows) the linears stream every
// weight from memory once per step, and oneDNN's packed float32 linear does not keep that
// stream busy: on a Zen 4 it read SmolLM2's weights at 18-25 GB/s where a plain read gets
// 30-45, and it did not overlap the reads with its arithmetic at 16-32 rows either. This
// kernel's loop is the plainest one that does: each 64-byte row of two 16-column panels is
// loaded once and feeds two FMAs per input row, up to 8 rows at a time (16 independent
// accumulators), and each thread walks one contiguous range of the packed weight, which the
// hardware prefetcher follows. benchmarks/cpu_gemm.py measures it against oneDNN.
//
// Packed layout: [P, K, 16] with P = 2 * ceil(N / 32): panel p holds output columns
// 16p .. 16p + 15 of W (zeros past N) as K rows of 16 floats.
//
// bfloat16 on CPUs with AVX512-BF16 takes the same loop with `vdpbf16ps`, which multiplies
// pairs of bfloat16 and adds both products into one float32 lane: its panels are [P, K / 2, 16, 2]
// (for each pair of inputs, the 16 columns' two weights side by side: one 64-byte row), each input
// pair is broadcast as one 32-bit value, sums stay float32 and the output is rounded to bfloat16
// once. Like torch's mkldnn packed linear it saves the per-call reorder, with far less per-call
// setup: at decoding sizes it was about 2x faster than that on a Sapphire Rapids Xeon
// (benchmarks/cpu_gemm.py --dtype bfloat16); oneDNN keeps the prompt sizes, where AMX wins.
//
// Built with the other CPU kernels by llmctl/kernels/cpu.py; without AVX-512 the ops are
// registered but `panel_linear_supported()` says false and llmctl keeps oneDNN.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t PANEL = 16;        // output columns per panel: one AVX-512 register
constexpr int64_t ROWS_PER_TILE = 8;  // input rows per tile: 2 x 8 accumulators
constexpr int64_t ROWS_PER_CHUNK = 128;  // a thread's panels are re-read (from cache) per chunk of rows

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu panel_linear: ", message); }

bool panel_linear_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// The float32 panel paths built here, widest first, as llmctl.kernels.cpu.CODED_ISAS codes (3 avx512, 2 avx2).
std::vector<int64_t> panel_isas() {
  std::vector<int64_t> isas;
#if defined(__AVX512F__)
  isas.push_back(3);
#endif
#if defined(__AVX2__) && defined(__FMA__)  // LLMCTL_PANELS_AVX2, defined further down
  isas.push_back(2);
#endif
  return isas;
}

bool bf16_panels_supported() {
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  return true;
#else
  return false;
#endif
}

at::Tensor pack_panels(const at::Tensor& weight) {
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  check(weight.dim() == 2 && (weight.scalar_type() == at::kFloat || bf16),
        "the weight is a float32 or bfloat16 [N, K] matrix");
  check(!bf16 || weight.size(1) % 2 == 0, "a bfloat16 weight has an even number of input columns");
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t panels = 2 * ((n + 2 * PANEL - 1) / (2 * PANEL));
  at::Tensor by_column = at::zeros({panels * PANEL, k}, weight.options());  // rows past N stay zero
  by_column.narrow(0, 0, n).copy_(weight);
  if (bf16)  // [P, 16, K / 2, 2] -> [P, K / 2, 16, 2]
    return by_column.view({panels, PANEL, k / 2, 2}).permute({0, 2, 1, 3}).contiguous().view({panels, k, PANEL});
  return by_column.view({panels, PANEL, k}).transpose(1, 2).contiguous();  // [P, 16, K] -> [P, K, 16]
}

#if defined(__AVX512F__)
// y[r, 0:cols] = x[r] · (two panels) (+ bias) for R rows; cols <= 32 are the valid columns.
template <int R>
inline void tile(const float* x, int64_t k, const float* panel0, const float* bias, int64_t cols, float* y,
                 int64_t y_stride) {
  const float* panel1 = panel0 + k * PANEL;
  const __mmask16 mask0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 mask1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1);
  const __m512 start0 = bias ? _mm512_maskz_loadu_ps(mask0, bias) : _mm512_setzero_ps();
  const __m512 start1 = bias ? _mm512_maskz_loadu_ps(mask1, bias + PANEL) : _mm512_setzero_ps();
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = start0;
    acc1[r] = start1;
  }
  for (int64_t i = 0; i < k; ++i) {
    const __m512 w0 = _mm512_loadu_ps(panel0 + i * PANEL), w1 = _mm512_loadu_ps(panel1 + i * PANEL);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * k + i]);
      acc0[r] = _mm512_fmadd_ps(a, w0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(a, w1, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + r * y_stride, mask0, acc0[r]);
    _mm512_mask_storeu_ps(y + r * y_stride + PANEL, mask1, acc1[r]);
  }
}

template <int... Rs>
inline void tile_of(int64_t rows, std::integer_sequence<int, Rs...>, const float* x, int64_t k, const float* panel0,
                    const float* bias, int64_t cols, float* y, int64_t y_stride) {
  ((rows == Rs + 1 ? tile<Rs + 1>(x, k, panel0, bias, cols, y, y_stride) : void()), ...);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define LLMCTL_PANELS_AVX2 1
// 6 rows × 2 registers of sums (one 16-column panel), 2 of weights, 1 broadcast: 15 of AVX2's 16
// registers, the shape of the Haswell sgemm kernels (BLIS's 6 × 16). A 3-row tile over both panels of a
// pair (12 sums, 4 weights) read twice the weight bytes per multiply and fell behind MKL from 24 rows.
constexpr int64_t AVX2_ROWS_PER_TILE = 6;

// As `tile`, in AVX2's 8-float registers, one 16-column panel (`cols` ≤ 16 of them) at a time.
template <int R>
inline void tile_avx2(const float* x, int64_t k, const float* panel, const float* bias, int64_t cols, float* y,
                      int64_t y_stride) {
  alignas(32) float start[PANEL] = {};
  if (bias) std::copy(bias, bias + cols, start);
  // Two arrays and unrolled row loops: with one acc[R][2] gcc stored every sum to the stack on each
  // step of the K loop, which halved the speed.
  __m256 left[R], right[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    left[r] = _mm256_load_ps(start);
    right[r] = _mm256_load_ps(start + 8);
  }
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = _mm256_loadu_ps(panel + i * PANEL), w1 = _mm256_loadu_ps(panel + i * PANEL + 8);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * k + i);
      left[r] = _mm256_fmadd_ps(a, w0, left[r]);
      right[r] = _mm256_fmadd_ps(a, w1, right[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[PANEL];
    _mm256_store_ps(out, left[r]);
    _mm256_store_ps(out + 8, right[r]);
    std::copy(out, out + cols, y + r * y_stride);
  }
}

template <int... Rs>
inline void tile_avx2_of(int64_t rows, std::integer_sequence<int, Rs...>, const float* x, int64_t k,
                         const float* panel, const float* bias, int64_t cols, float* y, int64_t y_stride) {
  ((rows == Rs + 1 ? tile_avx2<Rs + 1>(x, k, panel, bias, cols, y, y_stride) : void()), ...);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
inline __m512 bf16_to_float(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// As `tile`, for bfloat16 x, panels and y: one vdpbf16ps per input pair, panel and row.
template <int R>
inline void tile_bf16(const c10::BFloat16* x, int64_t k, const c10::BFloat16* panel0, const c10::BFloat16* bias,
                      int64_t cols, c10::BFloat16* y, int64_t y_stride) {
  const c10::BFloat16* panel1 = panel0 + k * PANEL;
  const __mmask16 mask0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 mask1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1);
  const __m512 start0 = bias ? bf16_to_float(bias, mask0) : _mm512_setzero_ps();
  const __m512 start1 = bias ? bf16_to_float(bias + PANEL, mask1) : _mm512_setzero_ps();
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = start0;
    acc1[r] = start1;
  }
  const int32_t* x_pairs = reinterpret_cast<const int32_t*>(x);  // x[r, 2i], x[r, 2i + 1] as one 32-bit value
  for (int64_t i = 0; i < k / 2; ++i) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel0 + 2 * i * PANEL);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel1 + 2 * i * PANEL);
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(x_pairs[r * (k / 2) + i]);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], a, w0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], a, w1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_mask_storeu_epi16(y + r * y_stride, mask0, (__m256i)_mm512_cvtneps_pbh(acc0[r]));
    _mm256_mask_storeu_epi16(y + r * y_stride + PANEL, mask1, (__m256i)_mm512_cvtneps_pbh(acc1[r]));
  }
}

template <int... Rs>
inline void tile_bf16_of(int64_t rows, std::integer_sequence<int, Rs...>, const c10::BFloat16* x, int64_t k,
                         const c10::BFloat16* panel0, const c10::BFloat16* bias, int64_t cols, c10::BFloat16* y,
                         int64_t y_stride) {
  ((rows == Rs + 1 ? tile_bf16<Rs + 1>(x, k, panel0, bias, cols, y, y_stride) : void()), ...);
}
#endif

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define LLMCTL_AMX 1
// AMX: the bfloat16 panels are already the layout a TMUL B tile reads (16 rows of one input pair's
// 16 columns × 2), so one tile covers 32 inputs × 16 columns of a panel. A tile holds up to 16 rows
// of x × 32 inputs, read in place from x; C tiles sum in float32 and are stored once per row tile.
constexpr int64_t AMX_ROWS = 16, AMX_INPUTS = 32;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Linux hands a process AMX's tile state only when asked (ARCH_REQ_XCOMP_PERM for XTILEDATA).
bool amx_granted() {
  static const bool granted = [] {
    if (!__builtin_cpu_supports("amx-bf16")) return false;
    constexpr int ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}

// Tiles 0: x rows, 1 and 2: the pair's two panels, 4 and 5: their sums; `rows` of x (1-16).
void configure_tiles(int64_t rows) {
  TileConfig config;
  for (int t : {0, 1, 2, 4, 5}) config.bytes_per_row[t] = 64;
  config.rows[0] = config.rows[4] = config.rows[5] = static_cast<uint8_t>(rows);
  config.rows[1] = config.rows[2] = 16;
  _tile_loadconfig(&config);
}

// y[0:rows, 0:cols] of one panel pair, for the configured number of rows (k a multiple of 32).
void amx_tile(const c10::BFloat16* x, int64_t k, const c10::BFloat16* panel0, const c10::BFloat16* bias, int64_t cols,
              int64_t rows, c10::BFloat16* y, int64_t y_stride) {
  const c10::BFloat16* panel1 = panel0 + k * PANEL;
  _tile_zero(4);
  _tile_zero(5);
  for (int64_t i = 0; i < k; i += AMX_INPUTS) {
    _tile_loadd(0, x + i, k * sizeof(c10::BFloat16));
    _tile_loadd(1, panel0 + i * PANEL, 2 * PANEL * sizeof(c10::BFloat16));
    _tile_loadd(2, panel1 + i * PANEL, 2 * PANEL * sizeof(c10::BFloat16));
    _tile_dpbf16ps(4, 0, 1);
    _tile_dpbf16ps(5, 0, 2);
  }
  alignas(64) float sums[2][AMX_ROWS][PANEL];
  _tile_stored(4, sums[0], PANEL * sizeof(float));
  _tile_stored(5, sums[1], PANEL * sizeof(float));
  for (int half = 0; half < 2; ++half) {
    const int64_t valid = std::clamp<int64_t>(cols - half * PANEL, 0, PANEL);
    if (valid == 0) continue;
    const __mmask16 mask = valid == PANEL ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
    const __m512 start = bias ? bf16_to_float(bias + half * PANEL, mask) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_load_ps(sums[half][r]), start);
      _mm256_mask_storeu_epi16(y + r * y_stride + half * PANEL, mask, (__m256i)_mm512_cvtneps_pbh(sum));
    }
  }
}

// panel_linear for bfloat16 through AMX: each thread a contiguous range of panel pairs; for each
// pair (32 columns, a few dozen KiB that stay in cache) the full 16-row tiles of x, then in a second
// pass the rows left over (tile shapes are set per thread, so each pass configures once).
void amx_linear(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias, c10::BFloat16* y,
                int64_t m, int64_t k, int64_t n) {
  const int64_t pairs = (n + 2 * PANEL - 1) / (2 * PANEL);
  const int64_t full_rows = m / AMX_ROWS * AMX_ROWS;
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    auto pass = [&](int64_t first_row, int64_t last_row, int64_t rows) {
      configure_tiles(rows);
      for (int64_t pair = begin; pair < end; ++pair) {
        const int64_t column = 2 * PANEL * pair;
        for (int64_t row = first_row; row < last_row; row += rows) {
          amx_tile(x + row * k, k, w + 2 * pair * k * PANEL, bias ? bias + column : nullptr,
                   std::min(2 * PANEL, n - column), rows, y + row * n + column, n);
        }
      }
    };
    if (full_rows > 0) pass(0, full_rows, AMX_ROWS);
    if (m > full_rows) pass(full_rows, m, m - full_rows);
    _tile_release();
  });
}
#endif

bool bf16_amx_supported() {
#if defined(LLMCTL_AMX)
  return amx_granted();
#else
  return false;
#endif
}

// Each thread takes a contiguous range of panel pairs; rows go in chunks (re-read from cache) and
// even tiles of up to max_rows: tile_call(x row, panel pair, rows, bias offset, cols, y offset).
template <typename TileCall>
void for_each_tile(int64_t m, int64_t n, TileCall&& tile_call, int64_t max_rows = ROWS_PER_TILE) {
  const int64_t pairs = (n + 2 * PANEL - 1) / (2 * PANEL);
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = 0; chunk < m; chunk += ROWS_PER_CHUNK) {
      const int64_t chunk_rows = std::min(ROWS_PER_CHUNK, m - chunk);
      const int64_t tiles = (chunk_rows + max_rows - 1) / max_rows;
      const int64_t rows_per_tile = (chunk_rows + tiles - 1) / tiles;  // even tiles: 12 rows are 6 + 6
      for (int64_t pair = begin; pair < end; ++pair) {
        for (int64_t row = chunk; row < chunk + chunk_rows; row += rows_per_tile) {
          tile_call(row, pair, std::min(rows_per_tile, chunk + chunk_rows - row), 2 * PANEL * pair);
        }
      }
    }
  });
}

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                        const c10::optional<at::Tensor>& bias, bool use_amx, int64_t isa) {
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  static const std::vector<int64_t> isas = panel_isas();  // fixed by the build: not rebuilt per call
  const int64_t chosen = isa == 0 && !isas.empty() ? isas.front() : isa;
  check(bf16 ? bf16_panels_supported() : std::find(isas.begin(), isas.end(), chosen) != isas.end(),
        bf16 ? "this build has no AVX512-BF16" : "this build has no float32 panel path for that ISA (avx512, avx2)");
  check(x.dim() == 2 && x.is_contiguous() && (x.scalar_type() == at::kFloat || bf16),
        "x is a contiguous float32 or bfloat16 [M, K]");
  check(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) == x.size(1) && packed.size(2) == PANEL &&
            packed.scalar_type() == x.scalar_type(),
        "packed comes from pack_panels of a [N, K] weight of x's dtype with K = x.size(1)");
  check(out_features > 0 && out_features <= packed.size(0) * PANEL, "out_features does not fit the panels");
  check(!bias.has_value() || (bias->is_contiguous() && bias->scalar_type() == x.scalar_type() &&
                              bias->numel() == out_features),
        "bias is [out_features] of x's dtype");
  const int64_t m = x.size(0), k = x.size(1), n = out_features;
  at::Tensor y = at::empty({m, n}, x.options());
  constexpr auto row_counts = std::make_integer_sequence<int, ROWS_PER_TILE>{};
  if (bf16) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    const auto* x_ptr = x.data_ptr<c10::BFloat16>();
    const auto* w_ptr = packed.data_ptr<c10::BFloat16>();
    const auto* b_ptr = bias.has_value() ? bias->data_ptr<c10::BFloat16>() : nullptr;
    auto* y_ptr = y.data_ptr<c10::BFloat16>();
#if defined(LLMCTL_AMX)
    if (use_amx && k % AMX_INPUTS == 0 && amx_granted()) {
      amx_linear(x_ptr, w_ptr, b_ptr, y_ptr, m, k, n);
      return y;
    }
#endif
    for_each_tile(m, n, [&](int64_t row, int64_t pair, int64_t rows, int64_t column) {
      tile_bf16_of(rows, row_counts, x_ptr + row * k, k, w_ptr + 2 * pair * k * PANEL, b_ptr ? b_ptr + column : nullptr,
                   std::min(2 * PANEL, n - column), y_ptr + row * n + column, n);
    });
#endif
    return y;
  }
  const float* x_ptr = x.data_ptr<float>();
  const float* w_ptr = packed.data_ptr<float>();
  const float* b_ptr = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* y_ptr = y.data_ptr<float>();
#if defined(__AVX512F__)
  if (chosen == 3) {
    for_each_tile(m, n, [&](int64_t row, int64_t pair, int64_t rows, int64_t column) {
      tile_of(rows, row_counts, x_ptr + row * k, k, w_ptr + 2 * pair * k * PANEL, b_ptr ? b_ptr + column : nullptr,
              std::min(2 * PANEL, n - column), y_ptr + row * n + column, n);
    });
    return y;
  }
#endif
#if defined(LLMCTL_PANELS_AVX2)
  constexpr auto avx2_row_counts = std::make_integer_sequence<int, AVX2_ROWS_PER_TILE>{};
  for_each_tile(m, n, [&](int64_t row, int64_t pair, int64_t rows, int64_t column) {
    for (int64_t half = 0; half < 2 && column + half * PANEL < n; ++half) {  // the pair's two panels
      const int64_t first = column + half * PANEL;
      tile_avx2_of(rows, avx2_row_counts, x_ptr + row * k, k, w_ptr + (2 * pair + half) * k * PANEL,
                   b_ptr ? b_ptr + first : nullptr, std::min(PANEL, n - first), y_ptr + row * n + first, n);
    }
  }, AVX2_ROWS_PER_TILE);
#endif
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("panel_linear_supported() -> bool", &panel_linear_supported);
  m.def("bf16_panels_supported() -> bool", &bf16_panels_supported);
  m.def("pack_panels(Tensor weight) -> Tensor");
  m.def("bf16_amx_supported() -> bool", &bf16_amx_supported);
  m.def("panel_isas() -> int[]", &panel_isas);
  m.def("panel_linear(Tensor x, Tensor packed, int out_features, Tensor? bias, bool use_amx=True, int isa=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("pack_panels", &pack_panels);
  m.impl("panel_linear", &panel_linear);
}
