// Coded weights times int8 activations: how llama.cpp (and vLLM's GGUF kernels) multiply GGUF weights.
//
// Each input row is quantized in blocks of 32 as llama.cpp's Q8_0 does (d = max|x| / 127, q = round(x / d),
// d kept as float16). A 32-weight chunk's dot product with a block is then taken in integers: the chunk's
// unsigned 4-bit codes (cpu_int4.cpp's packing) or signed 8-bit codes times the signed bytes q, summed to
// int32 (AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd), and scaled once per chunk by the weight
// block's scale · d; the offsets add offset · d · Σ q. Weight groups are 32 wide, as GGUF's blocks, or 16 wide
// (Q6_K, as llama.cpp's Q8_K dot products take its 16-weight scales): each half block then takes its own scale. Integer products skip converting every code
// to a float and take 32 multiplies per instruction, which is what bounded float decoding. The results
// carry the rounding of x that llama.cpp's carry; the reference is the weight and gguf-py's Q8_0 rounding
// of x, both dequantized, multiplied in float64. Paths: AVX-512 (with VNNI where built), AVX2, plain.
// `per_token`: x quantized as a compressed-tensors W8A8 checkpoint's activations are instead (one scale per row,
// cpu_q8_quantize.h), for its int8 weights widened to 32-wide groups: the scheme's GEMM, in integers, exactly.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

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

constexpr int64_t BLOCK = 32;  // activations per scale; weights per chunk

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu q8_linear: ", message); }

// x quantized: q [M, K], d [M, K / 32] (each block's scale) and sums [M, sum_stride] (d · Σ q of each block,
// or of each half block where the weight's groups are 16 wide).
// Per-token mode: the inputs of row r whose q is -128 (held as -127) are minus_at[minus_begin[r] .. minus_begin[r + 1]).
struct QuantizedRows {
  const int8_t* q;
  const float* d;
  const float* sums;
  int64_t k, blocks, sum_stride;
  const int64_t* minus_begin = nullptr;
  const int64_t* minus_at = nullptr;
  QuantizedRows at(int64_t row) const {
    return {q + row * k, d + row * blocks, sums + row * sum_stride, k, blocks, sum_stride,
            minus_begin ? minus_begin + row : nullptr, minus_at};
  }
};

#include "cpu_q8_quantize.h"

template <class S>  // float, or at::Half where exact
struct Weights {
  const uint8_t* codes;  // [N, K / 2] packed 4-bit, or [N, K] int8 bytes
  const S* scales;  // [N, K / 32]
  const S* offsets;  // [N, K / 32]
  int64_t k, groups, row_bytes;
  bool offsets_used;  // false when every offset is 0 (Q8_0): the sums are skipped
};

template <bool Signed>
inline int32_t code_at(const uint8_t* row, int64_t chunk, int j) {
  if constexpr (Signed) return reinterpret_cast<const int8_t*>(row)[chunk * BLOCK + j];
  const uint8_t byte = row[chunk * 16 + (j & 15)];
  return j < 16 ? byte & 0xF : byte >> 4;
}

// Adds chunk c's terms for R rows to acc: scale · d · Σ code·q + offset · d · Σ q.
template <int R, bool Signed, class W>
inline void chunk_plain(const W& w, int64_t n, int64_t c, const QuantizedRows& x, float (&acc)[R]) {
  const uint8_t* row = w.codes + n * w.row_bytes;
  const float scale = scalar(w.scales[n * w.groups + c]), offset = scalar(w.offsets[n * w.groups + c]);
  for (int r = 0; r < R; ++r) {
    const int8_t* q = x.q + r * x.k + c * BLOCK;
    int32_t dot = 0;
    for (int j = 0; j < BLOCK; ++j) dot += code_at<Signed>(row, c, j) * q[j];
    acc[r] += scale * x.d[r * x.blocks + c] * static_cast<float>(dot);
    if (w.offsets_used) acc[r] += offset * x.sums[r * x.blocks + c];
  }
}

template <int R, bool Signed, class W>
void row_plain(const W& w, int64_t n, const QuantizedRows& x, float* out) {
  float acc[R] = {};
  for (int64_t c = 0; c < w.k / BLOCK; ++c) chunk_plain<R, Signed>(w, n, c, x, acc);
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

// Weights in 16-wide groups (Q6_K; two per activation block), signed codes: each half block's integer dot
// product takes its own group's scale · the block's d.
template <int R, class W>
void row_plain_halves(const W& w, int64_t n, const QuantizedRows& x, float* out) {
  const int8_t* row = reinterpret_cast<const int8_t*>(w.codes + n * w.row_bytes);
  float acc[R] = {};
  for (int64_t g = 0; g < w.groups; ++g) {
    const float scale = scalar(w.scales[n * w.groups + g]), offset = scalar(w.offsets[n * w.groups + g]);
    for (int r = 0; r < R; ++r) {
      const int8_t* q = x.q + r * x.k + g * 16;
      int32_t dot = 0;
      for (int j = 0; j < 16; ++j) dot += row[g * 16 + j] * q[j];
      acc[r] += scale * x.d[r * x.blocks + g / 2] * static_cast<float>(dot);
      if (w.offsets_used) acc[r] += offset * x.sums[r * x.sum_stride + g];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r];
}

#if defined(__AVX2__) && defined(__FMA__)
// Chunk c's 32 codes as bytes in x's order: 4-bit codes j (low nibbles) then j + 16 (high nibbles).
template <bool Signed>
inline __m256i chunk_codes(const uint8_t* row, int64_t c) {
  if constexpr (Signed) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * BLOCK));
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * 16));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0xF));
}

// Eight int32 partial sums of codes · q: unsigned × signed bytes (signed codes: |code| × q · sign(code)).
template <bool Signed, bool Vnni>
inline __m256i dot32(__m256i codes, __m256i q) {
  if constexpr (Signed) {
    q = _mm256_sign_epi8(q, codes);
    codes = _mm256_sign_epi8(codes, codes);
  }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (Vnni) return _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, q);
#endif
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), _mm256_set1_epi16(1));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Chunks c .. c + 7: each one's weight scale · d of each row, and the offsets' terms added to offset_acc.
template <int R, class W>
inline void eight_scales(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m256 (&combined)[R],
                         __m256 (&offset_acc)[R]) {
  const __m256 scales = load8(w.scales + n * w.groups + c);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) combined[r] = _mm256_mul_ps(scales, _mm256_loadu_ps(x.d + r * x.blocks + c));
  if (!w.offsets_used) return;
  const __m256 offsets = load8(w.offsets + n * w.groups + c);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    offset_acc[r] = _mm256_fmadd_ps(offsets, _mm256_loadu_ps(x.sums + r * x.blocks + c), offset_acc[r]);
}

// Eight chunks from c: each chunk's scale · d is one lane of a vector made with one multiply, and each
// chunk takes its lane by a permute, where a scalar multiply and broadcast per chunk cost twice the
// instructions; the offsets' terms are one FMA for all eight. Chunks alternate between two accumulator
// sets so that consecutive FMAs do not wait on each other.
template <int R, bool Signed, bool Vnni, class W>
inline void eight_chunks(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m256 (&acc)[2][R],
                         __m256 (&offset_acc)[R]) {
  const uint8_t* row = w.codes + n * w.row_bytes;
  __m256 combined[R];
  eight_scales<R>(w, n, c, x, combined, offset_acc);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const __m256i codes = chunk_codes<Signed>(row, c + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + r * x.k + (c + i) * BLOCK));
      const __m256 scale = _mm256_permutevar8x32_ps(combined[r], _mm256_set1_epi32(i));
      acc[i & 1][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32<Signed, Vnni>(codes, q)), scale, acc[i & 1][r]);
    }
  }
}

// One chunk (the ones after the last eight): its scale · d broadcast, its offset term added to `tail`.
template <int R, bool Signed, bool Vnni, class W>
inline void one_chunk(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m256 (&acc)[R], float (&tail)[R]) {
  const __m256i codes = chunk_codes<Signed>(w.codes + n * w.row_bytes, c);
  const float scale = scalar(w.scales[n * w.groups + c]), offset = scalar(w.offsets[n * w.groups + c]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + r * x.k + c * BLOCK));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32<Signed, Vnni>(codes, q)),
                             _mm256_set1_ps(scale * x.d[r * x.blocks + c]), acc[r]);
    if (w.offsets_used) tail[r] += offset * x.sums[r * x.blocks + c];
  }
}

template <int R, bool Signed, bool Vnni, class W>
void row_avx2(const W& w, int64_t n, const QuantizedRows& x, float* out) {
  __m256 acc[2][R], offset_acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = offset_acc[r] = _mm256_setzero_ps();
  const int64_t chunks = w.k / BLOCK;
  int64_t c = 0;
  for (; c + 8 <= chunks; c += 8) eight_chunks<R, Signed, Vnni>(w, n, c, x, acc, offset_acc);
  float tail[R] = {};
  for (; c < chunks; ++c) one_chunk<R, Signed, Vnni>(w, n, c, x, acc[c & 1], tail);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    out[r] = sum8(_mm256_add_ps(_mm256_add_ps(acc[0][r], acc[1][r]), offset_acc[r])) + tail[r];
}

// As row_plain_halves: chunk c's eight int32 partial sums each cover four consecutive bytes (vpmaddubsw +
// vpmaddwd, or vpdpbusd), so lanes 0-3 take group 2c's scale and lanes 4-7 group 2c + 1's.
template <int R, bool Vnni, class W>
inline void half_groups_chunk(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m256 (&acc)[R],
                              float (&tail)[R]) {
  const int64_t first = n * w.groups + 2 * c;
  const __m256i codes = chunk_codes<true>(w.codes + n * w.row_bytes, c);
  const __m256i magnitudes = _mm256_sign_epi8(codes, codes);  // once for all rows (dot32 does it per row)
  const __m256 two = _mm256_set_m128(_mm_set1_ps(scalar(w.scales[first + 1])), _mm_set1_ps(scalar(w.scales[first])));
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + r * x.k + c * BLOCK));
    const __m256 scale = _mm256_mul_ps(two, _mm256_broadcast_ss(x.d + r * x.blocks + c));
    const __m256i dot = dot32<false, Vnni>(magnitudes, _mm256_sign_epi8(q, codes));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
    if (w.offsets_used)
      tail[r] += scalar(w.offsets[first]) * x.sums[r * x.sum_stride + 2 * c] +
                 scalar(w.offsets[first + 1]) * x.sums[r * x.sum_stride + 2 * c + 1];
  }
}

// Two chunks a step, into two accumulator sets named at compile time (indexed by a runtime chunk number
// they were kept in memory: 4 rows ran slower than float activations).
template <int R, bool Vnni, class W>
void row_avx2_halves(const W& w, int64_t n, const QuantizedRows& x, float* out) {
  __m256 even[R], odd[R];
  float tail[R] = {};
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm256_setzero_ps();
  const int64_t chunks = w.k / BLOCK;
  int64_t c = 0;
  for (; c + 2 <= chunks; c += 2) {
    half_groups_chunk<R, Vnni>(w, n, c, x, even, tail);
    half_groups_chunk<R, Vnni>(w, n, c + 1, x, odd, tail);
  }
  if (c < chunks) half_groups_chunk<R, Vnni>(w, n, c, x, even, tail);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) out[r] = sum8(_mm256_add_ps(even[r], odd[r])) + tail[r];
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX2__) && defined(__FMA__)
constexpr bool PAIRED_BUILT = true;

// Chunks c and c + 1 as 64 bytes: signed codes as stored; 4-bit codes in the paired order of quantize_row.
template <bool Signed>
inline __m512i pair_codes(const uint8_t* row, int64_t c) {
  if constexpr (Signed) return _mm512_loadu_si512(row + c * BLOCK);
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * 16));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
  return _mm512_and_si512(both, _mm512_set1_epi8(0xF));
}

template <bool Signed>
inline __m512i dot64(__m512i codes, __m512i q) {
  if constexpr (Signed) {  // no vpsignb in AVX-512: negate q where the code is negative, then |code|
    q = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(codes), _mm512_setzero_si512(), q);
    codes = _mm512_abs_epi8(codes);
  }
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, q);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(codes, q), _mm512_set1_epi16(1));
#endif
}

// Which of eight chunks' scales each int32 lane of pair p's dot product takes: signed, lanes 0-7 chunk 2p
// and 8-15 chunk 2p + 1; paired 4-bit, four lanes each of 2p, 2p + 1, 2p, 2p + 1.
template <bool Signed>
inline __m512i pair_lanes(int p) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i second = Signed ? _mm512_srli_epi32(lane, 3) : _mm512_and_si512(_mm512_srli_epi32(lane, 2),
                                                                                 _mm512_set1_epi32(1));
  return _mm512_add_epi32(second, _mm512_set1_epi32(2 * p));
}

template <int R, bool Signed, class W>
inline void eight_chunks_512(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m512 (&acc)[2][R],
                             __m256 (&offset_acc)[R]) {
  const uint8_t* row = w.codes + n * w.row_bytes;
  __m256 eight[R];
  eight_scales<R>(w, n, c, x, eight, offset_acc);
  __m512 combined[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) combined[r] = _mm512_castps256_ps512(eight[r]);
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    const __m512i codes = pair_codes<Signed>(row, c + 2 * p);
    const __m512i lanes = pair_lanes<Signed>(p);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512i q = _mm512_loadu_si512(x.q + r * x.k + (c + 2 * p) * BLOCK);
      const __m512 scale = _mm512_permutexvar_ps(lanes, combined[r]);
      acc[p & 1][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64<Signed>(codes, q)), scale, acc[p & 1][r]);
    }
  }
}

// Chunks c and c + 1 after the last eight: their scales · d set per pair, offsets added to `tail`.
template <int R, bool Signed, class W>
inline void pair_tail(const W& w, int64_t n, int64_t c, const QuantizedRows& x, __m512 (&acc)[R],
                      float (&tail)[R]) {
  const __m512i codes = pair_codes<Signed>(w.codes + n * w.row_bytes, c);
  const int64_t at = n * w.groups + c;
  const float s0 = scalar(w.scales[at]), s1 = scalar(w.scales[at + 1]);
  const float o0 = scalar(w.offsets[at]), o1 = scalar(w.offsets[at + 1]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512i q = _mm512_loadu_si512(x.q + r * x.k + c * BLOCK);
    const float* d = x.d + r * x.blocks + c;
    const __m512 two = _mm512_castps128_ps512(_mm_setr_ps(s0 * d[0], s1 * d[1], 0.0f, 0.0f));
    const __m512 scale = _mm512_permutexvar_ps(pair_lanes<Signed>(0), two);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64<Signed>(codes, q)), scale, acc[r]);
    if (w.offsets_used) tail[r] += o0 * x.sums[r * x.blocks + c] + o1 * x.sums[r * x.blocks + c + 1];
  }
}

// As row_avx2 with two chunks per instruction; after the last eight, pairs, then one chunk in 256 bits.
template <int R, bool Signed, class W>
void row_avx512(const W& w, int64_t n, const QuantizedRows& x, float* out) {
  __m512 acc[2][R];
  __m256 offset_acc[R], rest[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    acc[0][r] = acc[1][r] = _mm512_setzero_ps();
    offset_acc[r] = rest[r] = _mm256_setzero_ps();
  }
  const int64_t chunks = w.k / BLOCK;
  int64_t c = 0;
  for (; c + 8 <= chunks; c += 8) eight_chunks_512<R, Signed>(w, n, c, x, acc, offset_acc);
  float tail[R] = {};
  for (; c + 2 <= chunks; c += 2) pair_tail<R, Signed>(w, n, c, x, acc[0], tail);
  if (c < chunks) one_chunk<R, Signed, true>(w, n, c, x, rest, tail);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][r], acc[1][r])) +
             sum8(_mm256_add_ps(offset_acc[r], rest[r])) + tail[r];
}
#else
constexpr bool PAIRED_BUILT = false;
#endif

// Weights in 16-wide groups (Q6_K): one 256-bit path for AVX2 and AVX-512 CPUs (VNNI where present).
struct HalvesKernel {
  template <int R, class W>
  static void rows(int64_t isa, const W& w, int64_t n, const QuantizedRows& x, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    if (isa == AVX512) return row_avx2_halves<R, true>(w, n, x, out);
#endif
    if (isa == AVX2 || isa == AVX512) return row_avx2_halves<R, false>(w, n, x, out);
#endif
    row_plain_halves<R>(w, n, x, out);
  }

  template <class W>
  static void prefetch(const W& w, int64_t n) {
    llmctl_coded::prefetch_row(w.codes + n * w.row_bytes, w.row_bytes, w.scales + n * w.groups,
                               w.offsets + n * w.groups, w.groups);
  }
};

template <bool Signed>
struct Kernel {
  template <int R, class W>
  static void rows(int64_t isa, const W& w, int64_t n, const QuantizedRows& x, float* out) {
#if defined(__AVX2__) && defined(__FMA__)
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (isa == AVX512) return row_avx512<R, Signed>(w, n, x, out);
#endif
    if (isa == AVX2) return row_avx2<R, Signed, false>(w, n, x, out);
#endif
    row_plain<R, Signed>(w, n, x, out);
  }

  template <class W>
  static void prefetch(const W& w, int64_t n) {
    llmctl_coded::prefetch_row(w.codes + n * w.row_bytes, w.row_bytes, w.scales + n * w.groups,
                               w.offsets + n * w.groups, w.groups);
  }
};

// Per-token activations (W8A8) on int8 codes: the integer products took q = -127 where the library's is -128;
// the missing -1 · code · scale · d of each such input is added here, exactly (a byte of the row just read).
struct PerTokenKernel {
  template <int R, class W>
  static void rows(int64_t isa, const W& w, int64_t n, const QuantizedRows& x, float* out) {
    Kernel<true>::template rows<R>(isa, w, n, x, out);
    const int8_t* codes = reinterpret_cast<const int8_t*>(w.codes + n * w.row_bytes);
    for (int r = 0; r < R; ++r)
      for (int64_t i = x.minus_begin[r]; i < x.minus_begin[r + 1]; ++i) {
        const int64_t input = x.minus_at[i], block = input / BLOCK;
        out[r] -= scalar(w.scales[n * w.groups + block]) * x.d[r * x.blocks + block] * static_cast<float>(codes[input]);
      }
  }

  template <class W>
  static void prefetch(const W& w, int64_t n) {
    Kernel<true>::prefetch(w, n);
  }
};

at::Tensor q8_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& offsets,
                     const c10::optional<at::Tensor>& bias, int64_t isa, bool offsets_used, bool per_token) {
  check(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x is a contiguous float32 [M, K]");
  const bool packed = codes.scalar_type() == at::kByte;
  check((packed || codes.scalar_type() == at::kChar) && codes.dim() == 2 && codes.is_contiguous(),
        "codes are uint8 [N, K / 2] (4-bit, packed) or int8 [N, K]");
  const int64_t m = x.size(0), k = x.size(1), n = codes.size(0), groups = scales.size(1);
  check(codes.size(1) * (packed ? 2 : 1) == k, "x has K columns");
  const bool halves = groups * 16 == k;  // Q6_K's 16-wide groups, two per activation block
  check(k % BLOCK == 0 && (groups * BLOCK == k || (halves && !packed)),
        "K is a multiple of 32 and the groups are 32 wide (GGUF's blocks), or 16 wide with 8-bit codes (Q6_K)");
  check(scales.is_contiguous() && offsets.is_contiguous() && scales.size(0) == n && offsets.sizes() == scales.sizes(),
        "scales and offsets are [N, G]");
  check(!per_token || (!packed && groups * BLOCK == k), "per-token activations take int8 codes in 32-wide groups");
  isa = isa == AUTO ? llmctl_coded::widest() : isa;
  check(built(isa), "that instruction set is not built on this machine");

  const bool paired = packed && isa == AVX512 && PAIRED_BUILT;
  const int64_t blocks = k / BLOCK, sum_stride = halves ? 2 * blocks : blocks;
  // the quantized rows in buffers kept per calling thread: a decode step makes ~120 of these calls
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d, sums;
  thread_local std::vector<int64_t> minus_at, minus_begin;
  q.resize(m * k);
  d.resize(m * blocks);
  sums.resize(m * sum_stride);
  minus_at.clear();
  minus_begin.resize(m + 1);
  for (int64_t row = 0; row < m; ++row) {
    minus_begin[row] = static_cast<int64_t>(minus_at.size());
    quantize_row(x.data_ptr<float>() + row * k, k, q.data() + row * k, d.data() + row * blocks,
                 sums.data() + row * sum_stride, paired, halves, per_token ? &minus_at : nullptr);
  }
  minus_begin[m] = static_cast<int64_t>(minus_at.size());
  QuantizedRows input{q.data(), d.data(), sums.data(), k, blocks, sum_stride};
  if (per_token) {
    input.minus_begin = minus_begin.data();
    input.minus_at = minus_at.data();
  }

  at::Tensor y = at::empty({m, n}, x.options());
  llmctl_coded::with_scales(scales, offsets, [&](auto sp, auto op) {
    using S = std::remove_const_t<std::remove_pointer_t<decltype(sp)>>;
    const Weights<S> w{static_cast<const uint8_t*>(codes.data_ptr()), sp, op, k, groups, packed ? k / 2 : k,
                       offsets_used};
    if (per_token)
      llmctl_coded::run_rows<PerTokenKernel>(isa, w, input, m, n, y.data_ptr<float>());
    else if (halves)
      llmctl_coded::run_rows<HalvesKernel>(isa, w, input, m, n, y.data_ptr<float>());
    else if (packed)
      llmctl_coded::run_rows<Kernel<false>>(isa, w, input, m, n, y.data_ptr<float>());
    else
      llmctl_coded::run_rows<Kernel<true>>(isa, w, input, m, n, y.data_ptr<float>());
  });
  if (bias.has_value()) y.add_(*bias);
  return y;
}

bool q8_vnni() {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("q8_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets, Tensor? bias, int isa, bool offsets_used, "
        "bool per_token=False) -> Tensor");
  m.def("q8_vnni() -> bool", &q8_vnni);
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) { m.impl("q8_linear", &q8_linear); }
