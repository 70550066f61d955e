// 4-bit linears on CPUs: y = x Wᵀ (+ b) with W kept as 4-bit codes, never as a float copy.
//
// w[n, k] = code[n, k] · scale[n, g] + offset[n, g] for the group g = k / group_size (GPTQ and AWQ:
// offset = −zero · scale; GGUF Q4_1: the block's min; Q4_0: −8 · scale). Codes are packed 32 to 16
// bytes, as GGUF's Q4_0/Q4_1 blocks are: byte j of a chunk holds code j in its low nibble and code
// j + 16 in its high nibble, so one 16-byte load widens to 16 codes (low) and the next 16 (high).
//
// Each thread takes a range of output rows; for up to four input rows at a time a chunk's 32
// weights are decoded once (widen, mask/shift, convert, one FMA with scale and offset) and feed
// every row's accumulators. Decoding reads half a byte per weight where float32 reads four, which
// is what bounds decoding on a CPU. Three paths from one layout: AVX-512, AVX2 (each compiled where
// the compiler targets it) and plain C++; `isa` picks one (0: the widest built), so a test on an
// AVX-512 machine checks the AVX2 path too. Reference: the weight dequantized in torch.

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

constexpr int64_t CHUNK = 32;  // codes per 16 bytes

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu int4_linear: ", message); }

template <class S>  // float, or at::Half where exact
struct Weights {
  const uint8_t* codes;  // [N, K / 2]
  const S* scales;   // [N, G]
  const S* offsets;  // [N, G]
  int64_t k, groups, group_size;
};

// out[r] = Σ_k x[r, k] · w[n, k] for R rows of x (stride x_stride) and the one output row n.
template <int R, class W>
void row_plain(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  float acc[R] = {};
  const uint8_t* codes = w.codes + n * w.k / 2;
  for (int64_t c = 0; c < w.k / CHUNK; ++c) {
    const int64_t g = c * CHUNK / w.group_size;
    const float scale = scalar(w.scales[n * w.groups + g]);
    const float offset = scalar(w.offsets[n * w.groups + g]);
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = codes[c * 16 + j];
      const float low = (byte & 0xF) * scale + offset, high = (byte >> 4) * scale + offset;
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * x_stride + c * CHUNK;
        acc[r] += low * xr[j] + high * xr[16 + j];
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Independent accumulators: a single chain of dependent FMAs per input row waits out each FMA's latency
// (4 cycles) where the CPU could start two FMAs per cycle, and with one or two input rows (decoding) that
// wait, not memory, bounded the kernel. Groups alternate between SETS accumulator sets (low and high
// nibbles apart, too); the loops over sets and rows have constant bounds and unroll, so every
// accumulator stays in a register.
#if defined(__AVX512F__)
template <int R, class W>
inline void group_avx512(const W& w, int64_t n, int64_t g, const float* x, int64_t x_stride,
                         __m512 (&low_acc)[R], __m512 (&high_acc)[R]) {
  const __m512 scale = _mm512_set1_ps(scalar(w.scales[n * w.groups + g]));
  const __m512 offset = _mm512_set1_ps(scalar(w.offsets[n * w.groups + g]));
  const __m512i nibble = _mm512_set1_epi32(0xF);
  const uint8_t* codes = w.codes + n * w.k / 2;
  const int64_t per_group = w.group_size / CHUNK;
  for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
    const __m512i wide = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + c * 16)));
    const __m512 low = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(wide, nibble)), scale, offset);
    const __m512 high = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(wide, 4)), scale, offset);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float* xr = x + r * x_stride + c * CHUNK;
      low_acc[r] = _mm512_fmadd_ps(low, _mm512_loadu_ps(xr), low_acc[r]);
      high_acc[r] = _mm512_fmadd_ps(high, _mm512_loadu_ps(xr + 16), high_acc[r]);
    }
  }
}

template <int R, class W>
void row_avx512(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  constexpr int SETS = R <= 2 ? 2 : 1;
  __m512 low[SETS][R], high[SETS][R];
#pragma GCC unroll 2
  for (int s = 0; s < SETS; ++s)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) low[s][r] = high[s][r] = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + SETS <= w.groups; g += SETS)
#pragma GCC unroll 2
    for (int s = 0; s < SETS; ++s) group_avx512<R>(w, n, g + s, x, x_stride, low[s], high[s]);
  for (; g < w.groups; ++g) group_avx512<R>(w, n, g, x, x_stride, low[0], high[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m512 sum = _mm512_add_ps(low[0][r], high[0][r]);
    if constexpr (SETS == 2) sum = _mm512_add_ps(sum, _mm512_add_ps(low[1][r], high[1][r]));
    out[r] = _mm512_reduce_add_ps(sum);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
template <int R, class W>
inline void group_avx2(const W& w, int64_t n, int64_t g, const float* x, int64_t x_stride,
                       __m256 (&low_acc)[R], __m256 (&high_acc)[R]) {
  const __m256 scale = _mm256_set1_ps(scalar(w.scales[n * w.groups + g]));
  const __m256 offset = _mm256_set1_ps(scalar(w.offsets[n * w.groups + g]));
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const uint8_t* codes = w.codes + n * w.k / 2;
  const int64_t per_group = w.group_size / CHUNK;
  for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {  // bytes 8h..8h+7: codes 8h.. (low) and 16 + 8h.. (high)
      const __m256i wide = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + c * 16 + 8 * half)));
      const __m256 low = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(wide, nibble)), scale, offset);
      const __m256 high = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(wide, 4)), scale, offset);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * x_stride + c * CHUNK + 8 * half;
        low_acc[r] = _mm256_fmadd_ps(low, _mm256_loadu_ps(xr), low_acc[r]);
        high_acc[r] = _mm256_fmadd_ps(high, _mm256_loadu_ps(xr + 16), high_acc[r]);
      }
    }
  }
}

template <int R, class W>
void row_avx2(const W& w, int64_t n, const float* x, int64_t x_stride, float* out) {
  constexpr int SETS = R <= 2 ? 2 : 1;  // 16 registers: two sets for up to two rows
  __m256 low[SETS][R], high[SETS][R];
#pragma GCC unroll 2
  for (int s = 0; s < SETS; ++s)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) low[s][r] = high[s][r] = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + SETS <= w.groups; g += SETS)
#pragma GCC unroll 2
    for (int s = 0; s < SETS; ++s) group_avx2<R>(w, n, g + s, x, x_stride, low[s], high[s]);
  for (; g < w.groups; ++g) group_avx2<R>(w, n, g, x, x_stride, low[0], high[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256 sum = _mm256_add_ps(low[0][r], high[0][r]);
    if constexpr (SETS == 2) sum = _mm256_add_ps(sum, _mm256_add_ps(low[1][r], high[1][r]));
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
    llmctl_coded::prefetch_row(w.codes + n * w.k / 2, w.k / 2, w.scales + n * w.groups,
                               w.offsets + n * w.groups, w.groups);
  }
};

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets, const c10::optional<at::Tensor>& bias, int64_t isa) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x is a contiguous float32 [M, K]");
  const int64_t m = x.size(0), k = x.size(1), n = codes.size(0), groups = scales.size(1);
  check(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(1) * 2 == k,
        "codes are uint8 [N, K / 2]");
  check(k % CHUNK == 0 && groups > 0 && k % groups == 0 && (k / groups) % CHUNK == 0,
        "K and the group size are multiples of 32");
  check(scales.is_contiguous() && offsets.is_contiguous() && scales.size(0) == n && offsets.sizes() == scales.sizes(),
        "scales and offsets are [N, G]");
  isa = isa == AUTO ? llmctl_coded::widest() : isa;
  check(built(isa), "that instruction set is not built on this machine");
  at::Tensor y = at::empty({m, n}, x.options());
  llmctl_coded::with_scales(scales, offsets, [&](auto sp, auto op) {
    const Weights<std::remove_const_t<std::remove_pointer_t<decltype(sp)>>> w{codes.data_ptr<uint8_t>(), sp, op, k,
                                                                              groups, k / groups};
    llmctl_coded::run_rows<Kernel>(isa, w, llmctl_coded::FloatRows{x.data_ptr<float>(), k}, m, n,
                                   y.data_ptr<float>());
  });
  if (bias.has_value()) y.add_(*bias);
  return y;
}

// The float32 weight [N, K]: for many input rows a float GEMM over it is faster than decoding per row.
at::Tensor int4_dequantize(const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets) {
  check(codes.scalar_type() == at::kByte && codes.is_contiguous() && scales.is_contiguous() && offsets.is_contiguous(),
        "uint8 codes, scales and offsets, contiguous");
  const int64_t n = codes.size(0), k = codes.size(1) * 2, groups = scales.size(1);
  check(k % CHUNK == 0 && groups > 0 && k % groups == 0 && (k / groups) % CHUNK == 0,
        "K and the group size are multiples of 32");
  at::Tensor out = at::empty({n, k}, scales.options().dtype(at::kFloat));
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  float* wp = out.data_ptr<float>();
  llmctl_coded::with_scales(scales, offsets, [&](auto sp, auto op) {
    at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        for (int64_t c = 0; c < k / CHUNK; ++c) {
          const int64_t g = c * CHUNK / (k / groups);
          const float scale = scalar(sp[row * groups + g]), offset = scalar(op[row * groups + g]);
          const uint8_t* bytes = cp + row * k / 2 + c * 16;
          float* w = wp + row * k + c * CHUNK;
          for (int j = 0; j < 16; ++j) {
            w[j] = (bytes[j] & 0xF) * scale + offset;
            w[16 + j] = (bytes[j] >> 4) * scale + offset;
          }
        }
      }
    });
  });
  return out;
}

std::vector<int64_t> int4_isas() {
  std::vector<int64_t> out;
  for (int64_t isa : {AVX512, AVX2, llmctl_coded::PLAIN})
    if (built(isa)) out.push_back(isa);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("int4_isas() -> int[]", &int4_isas);
  m.def("int4_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, Tensor? bias, int isa) -> Tensor");
  m.def("int4_dequantize(Tensor codes, Tensor scales, Tensor offsets) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int4_dequantize", &int4_dequantize);
}
