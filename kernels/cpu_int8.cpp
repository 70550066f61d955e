// 8-bit linears on CPUs: y = x Wᵀ (+ b) with W kept as signed byte codes, never as a float copy.
//
// w[n, k] = code[n, k] · scale[n, g] + offset[n, g] for the group g = k / group_size, a multiple of 16:
// GGUF's Q8_0 (offset 0), Q5_0/Q5_1/Q5_K (5-bit codes) and Q6_K (6-bit codes, groups of 16) all fit,
// as do 4-bit codes when one fused layer mixes 4-bit and 8-bit parts. The structure is cpu_int4.cpp's:
// a thread per range of output rows, a 16-code chunk decoded once (widen, convert, one FMA with scale
// and offset) for up to four input rows, AVX-512 / AVX2 / plain paths chosen by `isa` (0: the widest
// built). Reference: the weight dequantized in torch.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu_coded.h"

namespace {

using llmctl_coded::AUTO;
using llmctl_coded::AVX2;
using llmctl_coded::AVX512;
using llmctl_coded::built;
using llmctl_coded::scalar;
#if defined(__AVX2__) && defined(__FMA__)
using llmctl_coded::sum8;
#endif

constexpr int64_t CHUNK = 16;  // codes per decode

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu int8_linear: ", message); }

template <class S>  // float, or at::Half where exact
struct Weights {
  const int8_t* codes;  // [N, K]
  const S* scales;  // [N, G]
  const S* offsets;
  int64_t k, groups, group_size;
};

template <int R, class W>
void row_plain(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  float acc[R] = {};
  const int8_t* codes = w.codes + n * w.k;
  for (int64_t g = 0; g < w.groups; ++g) {
    const float scale = scalar(w.scales[n * w.groups + g]), offset = scalar(w.offsets[n * w.groups + g]);
    for (int64_t j = g * w.group_size; j < (g + 1) * w.group_size; ++j) {
      const float weight = codes[j] * scale + offset;
      for (int r = 0; r < R; ++r) acc[r] += weight * x[r * x_stride + j];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Groups alternate between SETS independent accumulator sets, unrolled so they stay in registers
// (cpu_int4.cpp says why one chain per row is slow).
#if defined(__AVX512F__)
template <int R, class W>
inline void group_avx512(const W& w, int64_t n, int64_t g, const float* x, int64_t x_stride,
                         __m512 (&acc)[R]) {
  const __m512 scale = _mm512_set1_ps(scalar(w.scales[n * w.groups + g]));
  const __m512 offset = _mm512_set1_ps(scalar(w.offsets[n * w.groups + g]));
  const int8_t* codes = w.codes + n * w.k;
  for (int64_t j = g * w.group_size; j < (g + 1) * w.group_size; j += CHUNK) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j));
    const __m512 weight = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), scale, offset);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(weight, _mm512_loadu_ps(x + r * x_stride + j), acc[r]);
  }
}

template <int R, class W>
void row_avx512(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  constexpr int SETS = R <= 2 ? 4 : 2;
  __m512 acc[SETS][R];
#pragma GCC unroll 4
  for (int s = 0; s < SETS; ++s)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[s][r] = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + SETS <= w.groups; g += SETS)
#pragma GCC unroll 4
    for (int s = 0; s < SETS; ++s) group_avx512<R>(w, n, g + s, x, x_stride, acc[s]);
  for (; g < w.groups; ++g) group_avx512<R>(w, n, g, x, x_stride, acc[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m512 sum = acc[0][r];
#pragma GCC unroll 4
    for (int s = 1; s < SETS; ++s) sum = _mm512_add_ps(sum, acc[s][r]);
    out[r] = _mm512_reduce_add_ps(sum);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <int R, class W>
inline void group_avx2(const W& w, int64_t n, int64_t g, const float* x, int64_t x_stride,
                       __m256 (&acc)[R]) {
  const __m256 scale = _mm256_set1_ps(scalar(w.scales[n * w.groups + g]));
  const __m256 offset = _mm256_set1_ps(scalar(w.offsets[n * w.groups + g]));
  const int8_t* codes = w.codes + n * w.k;
  for (int64_t j = g * w.group_size; j < (g + 1) * w.group_size; j += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j));
    const __m256 weight = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)), scale, offset);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(x + r * x_stride + j), acc[r]);
  }
}

template <int R, class W>
void row_avx2(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  constexpr int SETS = R <= 2 ? 4 : 2;
  __m256 acc[SETS][R];
#pragma GCC unroll 4
  for (int s = 0; s < SETS; ++s)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[s][r] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + SETS <= w.groups; g += SETS)
#pragma GCC unroll 4
    for (int s = 0; s < SETS; ++s) group_avx2<R>(w, n, g + s, x, x_stride, acc[s]);
  for (; g < w.groups; ++g) group_avx2<R>(w, n, g, x, x_stride, acc[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256 sum = acc[0][r];
#pragma GCC unroll 4
    for (int s = 1; s < SETS; ++s) sum = _mm256_add_ps(sum, acc[s][r]);
    out[r] = sum8(sum);
  }
}
#endif

struct Kernel {
  template <int R, class W>
  static void rows(int64_t isa, const W& w, int64_t n, const llmctl_coded::FloatRows& in, float* out) {
    const float* x = in.x;
    const int64_t x_stride = in.stride;
#if defined(__AVX512F__)
    if (isa == AVX512) return row_avx512<R>(w, n, x, x_stride, out);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    if (isa == AVX2) return row_avx2<R>(w, n, x, x_stride, out);
#endif
    row_plain<R>(w, n, x, x_stride, out);
  }

  template <class W>
  static void prefetch(const W& w, int64_t n) {
    llmctl_coded::prefetch_row(w.codes + n * w.k, w.k, w.scales + n * w.groups,
                               w.offsets + n * w.groups, w.groups);
  }
};

void check_codes(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets) {
  check(codes.scalar_type() == at::kChar && codes.dim() == 2 && codes.is_contiguous(), "codes are int8 [N, K]");
  const int64_t n = codes.size(0), k = codes.size(1), groups = scales.size(1);
  check(groups > 0 && k % groups == 0 && (k / groups) % CHUNK == 0, "the group size is a multiple of 16");
  check(scales.is_contiguous() && offsets.is_contiguous() && scales.size(0) == n && offsets.sizes() == scales.sizes(),
        "scales and offsets are [N, G]");
}

// f(w) with the Weights of the tensors' scale type.
template <class F>
void with_weights(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets, F f) {
  check_codes(codes, scales, offsets);
  const int64_t k = codes.size(1), groups = scales.size(1);
  llmctl_coded::with_scales(scales, offsets, [&](auto sp, auto op) {
    f(Weights<std::remove_const_t<std::remove_pointer_t<decltype(sp)>>>{codes.data_ptr<int8_t>(), sp, op, k,
                                                                         groups, k / groups});
  });
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, const c10::optional<at::Tensor>& bias, int64_t isa) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x is a contiguous float32 [M, K]");
  check(x.size(1) == codes.size(1), "x has K columns");
  isa = isa == AUTO ? llmctl_coded::widest() : isa;
  check(built(isa), "that instruction set is not built on this machine");
  const int64_t m = x.size(0), n = codes.size(0), k = codes.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  with_weights(codes, scales, offsets, [&](const auto& w) {
    llmctl_coded::run_rows<Kernel>(isa, w, llmctl_coded::FloatRows{x.data_ptr<float>(), k}, m, n,
                                   y.data_ptr<float>());
  });
  if (bias.has_value()) y.add_(*bias);
  return y;
}

at::Tensor int8_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets) {
  const int64_t n = codes.size(0), k = codes.size(1);
  at::Tensor out = at::empty({n, k}, scales.options().dtype(at::kFloat));
  float* wp = out.data_ptr<float>();
  with_weights(codes, scales, offsets, [&](const auto& w) {
    at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row)
        for (int64_t j = 0; j < w.k; ++j) {
          const int64_t g = row * w.groups + j / w.group_size;
          wp[row * w.k + j] = w.codes[row * w.k + j] * scalar(w.scales[g]) + scalar(w.offsets[g]);
        }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, Tensor? bias, int isa) -> Tensor");
  m.def("int8_dequantize(Tensor codes, Tensor scales, Tensor offsets) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("int8_linear", &int8_linear);
  m.impl("int8_dequantize", &int8_dequantize);
}
