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
// Built with the other CPU kernels by llmctl/kernels/cpu.py; without AVX-512 the ops are
// registered but `panel_linear_supported()` says false and llmctl keeps oneDNN.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <utility>
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

at::Tensor pack_panels(const at::Tensor& weight) {
  check(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "the weight is a float32 [N, K] matrix");
  const int64_t n = weight.size(0), k = weight.size(1);
  const int64_t panels = 2 * ((n + 2 * PANEL - 1) / (2 * PANEL));
  at::Tensor by_column = at::zeros({panels * PANEL, k}, weight.options());  // rows past N stay zero
  by_column.narrow(0, 0, n).copy_(weight);
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

at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& packed, int64_t out_features,
                        const c10::optional<at::Tensor>& bias) {
  check(panel_linear_supported(), "this build has no AVX-512");
  check(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat, "x is a contiguous float32 [M, K]");
  check(packed.dim() == 3 && packed.is_contiguous() && packed.size(1) == x.size(1) && packed.size(2) == PANEL &&
            packed.scalar_type() == at::kFloat,
        "packed comes from pack_panels of a [N, K] weight with K = x.size(1)");
  check(out_features > 0 && out_features <= packed.size(0) * PANEL, "out_features does not fit the panels");
  check(!bias.has_value() || (bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == out_features),
        "bias is float32 [out_features]");
  const int64_t m = x.size(0), k = x.size(1), n = out_features;
  at::Tensor y = at::empty({m, n}, x.options());
#if defined(__AVX512F__)
  const float* x_ptr = x.data_ptr<float>();
  const float* w_ptr = packed.data_ptr<float>();
  const float* b_ptr = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* y_ptr = y.data_ptr<float>();
  const int64_t pairs = (n + 2 * PANEL - 1) / (2 * PANEL);
  at::parallel_for(0, pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t chunk = 0; chunk < m; chunk += ROWS_PER_CHUNK) {
      const int64_t chunk_rows = std::min(ROWS_PER_CHUNK, m - chunk);
      const int64_t tiles = (chunk_rows + ROWS_PER_TILE - 1) / ROWS_PER_TILE;
      const int64_t rows_per_tile = (chunk_rows + tiles - 1) / tiles;  // even tiles: 12 rows are 6 + 6
      for (int64_t pair = begin; pair < end; ++pair) {
        const int64_t column = 2 * PANEL * pair;
        for (int64_t row = chunk; row < chunk + chunk_rows; row += rows_per_tile) {
          tile_of(std::min(rows_per_tile, chunk + chunk_rows - row), std::make_integer_sequence<int, ROWS_PER_TILE>{},
                  x_ptr + row * k, k, w_ptr + 2 * pair * k * PANEL, b_ptr ? b_ptr + column : nullptr,
                  std::min(2 * PANEL, n - column), y_ptr + row * n + column, n);
        }
      }
    }
  });
#endif
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("panel_linear_supported() -> bool", &panel_linear_supported);
  m.def("pack_panels(Tensor weight) -> Tensor");
  m.def("panel_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("pack_panels", &pack_panels);
  m.impl("panel_linear", &panel_linear);
}
