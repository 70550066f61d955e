// Shared by cpu_int4.cpp and cpu_int8.cpp (weights kept as codes with a scale and offset per group): which
// instruction sets are built, and the loop that runs a kernel's per-output-row function over threads (a range
// of output rows each) and up to MAX_ROWS input rows at a time, requesting rows PREFETCH_ROWS ahead.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace llmctl_coded {

enum Isa : int64_t { AUTO = 0, PLAIN = 1, AVX2 = 2, AVX512 = 3 };
constexpr int MAX_ROWS = 4;  // input rows sharing one decode of the codes
// Output rows are read one after another from three arrays (codes, scales, offsets): the hardware prefetcher
// alone left single-row decoding waiting on memory, so the rows this far ahead are requested early.
constexpr int64_t PREFETCH_ROWS = 16;

inline bool built(int64_t isa) {
  switch (isa) {
    case PLAIN: return true;
#if defined(__AVX2__) && defined(__FMA__)
    case AVX2: return true;
#endif
#if defined(__AVX512F__)
    case AVX512: return true;
#endif
    default: return false;
  }
}

inline int64_t widest() { return built(AVX512) ? AVX512 : built(AVX2) ? AVX2 : PLAIN; }

#if defined(__AVX2__) && defined(__FMA__)
inline float sum8(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}
#endif

// A group's scale and offset: float32, or float16 where that holds them exactly (GGUF stores Q4_0, Q4_1,
// Q5_0, Q5_1 and Q8_0's so), which halves their share of the bytes a decode reads.
inline float scalar(float v) { return v; }
inline float scalar(at::Half v) {
#if defined(__F16C__)
  return _cvtsh_ss(v.x);
#else
  return static_cast<float>(v);
#endif
}

// Calls f(scales, offsets) with the tensors' float or at::Half pointers (both of one dtype, checked).
template <class F>
void with_scales(const at::Tensor& scales, const at::Tensor& offsets, F f) {
  TORCH_CHECK(scales.scalar_type() == offsets.scalar_type() &&
                  (scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf),
              "llmctl coded weights: scales and offsets are both float32 or both float16");
  if (scales.scalar_type() == at::kHalf) return f(scales.data_ptr<at::Half>(), offsets.data_ptr<at::Half>());
  f(scales.data_ptr<float>(), offsets.data_ptr<float>());
}

// One output row's codes (`code_bytes` bytes) and its `groups` scales and offsets.
template <class S>
inline void prefetch_row(const void* codes, int64_t code_bytes, const S* scales, const S* offsets,
                         int64_t groups) {
#if defined(__AVX2__) || defined(__AVX512F__)
  const char* bytes = static_cast<const char*>(codes);
  for (int64_t byte = 0; byte < code_bytes; byte += 64) _mm_prefetch(bytes + byte, _MM_HINT_T0);
  for (int64_t g = 0; g < groups; g += 64 / static_cast<int64_t>(sizeof(S))) {
    _mm_prefetch(reinterpret_cast<const char*>(scales + g), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(offsets + g), _MM_HINT_T0);
  }
#endif
}

// Float32 input rows [M, K]: `at(row)` is the view from that row on.
struct FloatRows {
  const float* x;
  int64_t stride;
  FloatRows at(int64_t row) const { return {x + row * stride, stride}; }
};

// y [M, N] = x Wᵀ through Kernel::rows<R>(isa, w, n, input.at(row), out) (R input rows from `row`, output row
// n) and Kernel::prefetch(w, n); `input` is FloatRows or a kernel's own (int8 activations).
template <class Kernel, class Weights, class Input>
void run_rows(int64_t isa, const Weights& w, const Input& input, int64_t m, int64_t n, float* y) {
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = 0; row < m; row += MAX_ROWS) {  // the rows' x stays in cache over the outputs
      const int64_t count = std::min<int64_t>(MAX_ROWS, m - row);
      const auto xr = input.at(row);
      for (int64_t out = begin; out < end; ++out) {
        if (out + PREFETCH_ROWS < end) Kernel::prefetch(w, out + PREFETCH_ROWS);
        float result[MAX_ROWS];
        switch (count) {
          case 1: Kernel::template rows<1>(isa, w, out, xr, result); break;
          case 2: Kernel::template rows<2>(isa, w, out, xr, result); break;
          case 3: Kernel::template rows<3>(isa, w, out, xr, result); break;
          default: Kernel::template rows<4>(isa, w, out, xr, result); break;
        }
        for (int64_t r = 0; r < count; ++r) y[(row + r) * n + out] = result[r];
      }
    }
  });
}

}  // namespace llmctl_coded
