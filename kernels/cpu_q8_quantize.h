// Included by cpu_q8.cpp inside its anonymous namespace (after BLOCK): each input row quantized to int8 in
// blocks of 32 as llama.cpp's Q8_0 — in AVX2 registers where the build has them (a decode step quantizes
// ~120 rows, one thread each, before the parallel products), else the scalar loop.
#pragma once

// The largest |x| of one block of 32.
inline float block_amax(const float* xb) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < BLOCK / 8; ++i) amax = _mm256_max_ps(amax, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(xb + 8 * i)));
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_max_ss(half, _mm_shuffle_ps(half, half, 1)));
#else
  float amax = 0.0f;
  for (int j = 0; j < BLOCK; ++j) amax = std::max(amax, std::fabs(xb[j]));
  return amax;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
inline int32_t sum8_int(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// A block's 32 rounded values (four vectors of eight int32 in [-128, 127]) as bytes at q, and its halves' sums.
inline void store_block(const __m256i (&ints)[4], int8_t* q, int32_t (&total)[2]) {
  total[0] = sum8_int(_mm256_add_epi32(ints[0], ints[1]));
  total[1] = sum8_int(_mm256_add_epi32(ints[2], ints[3]));
  // packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#endif

// q = round half away from zero of x · inverse for one block, and the sums of its two halves' q.
inline void round_block(const float* xb, float inverse, int8_t* q, int32_t (&total)[2]) {
#if defined(__AVX2__) && defined(__FMA__)
  // std::round in eight lanes: truncate, then one more step away from zero where the dropped part is ≥ ½
  const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), _mm256_set1_ps(inverse));
    const __m256 whole = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 away = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, whole)), half, _CMP_GE_OQ);
    const __m256 step = _mm256_and_ps(away, _mm256_or_ps(_mm256_and_ps(v, sign), one));
    ints[i] = _mm256_cvttps_epi32(_mm256_add_ps(whole, step));
  }
  store_block(ints, q, total);
#else
  total[0] = total[1] = 0;
  for (int j = 0; j < BLOCK; ++j) {
    const int32_t v = static_cast<int32_t>(std::round(xb[j] * inverse));
    q[j] = static_cast<int8_t>(v);
    total[j / 16] += v;
  }
#endif
}

// a / b, divided: the build's -ffast-math would multiply by b's reciprocal instead, an ulp away from the library's
// quotient at times, which moves ties (x / scale on a half) to the other integer.
#if defined(__AVX2__) && defined(__FMA__)
inline __m256 divided(__m256 a, __m256 b) {
  __m256 quotient;
  asm("vdivps %2, %1, %0" : "=x"(quotient) : "x"(a), "x"(b));
  return quotient;
}
#endif
inline float divided(float a, float b) {
  volatile float divisor = b;  // unknown to the compiler: no reciprocal taken
  return a / divisor;
}

// q = round half to even of x / scale, clamped to [-127, 127], for one block starting at input `start`, and the
// sums of its halves' q; the inputs that round to -128 (the library's value there) are added to `minus`.
inline void round_block_even(const float* xb, float scale, int64_t start, int8_t* q, int32_t (&total)[2],
                             std::vector<int64_t>& minus) {
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 low = _mm256_set1_ps(-127.0f), high = _mm256_set1_ps(127.0f);
  __m256i ints[4];
  for (int i = 0; i < 4; ++i) {
    const __m256 v = divided(_mm256_loadu_ps(xb + 8 * i), _mm256_set1_ps(scale));
    const __m256 even = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    for (int bits = _mm256_movemask_ps(_mm256_cmp_ps(even, low, _CMP_LT_OQ)); bits != 0; bits &= bits - 1)
      minus.push_back(start + 8 * i + __builtin_ctz(bits));
    ints[i] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(even, low), high));
  }
  store_block(ints, q, total);
#else
  total[0] = total[1] = 0;
  for (int j = 0; j < BLOCK; ++j) {
    const float even = std::nearbyint(divided(xb[j], scale));
    if (even < -127.0f) minus.push_back(start + j);
    const int32_t v = static_cast<int32_t>(std::clamp(even, -127.0f, 127.0f));
    q[j] = static_cast<int8_t>(v);
    total[j / 16] += v;
  }
#endif
}

// compressed-tensors' dynamic per-token int8 scale (a W8A8 checkpoint's activations): max|x| of the whole row / 127.5,
// float32's eps where the row is all zeros, as the library computes it.
inline float token_scale(const float* x, int64_t k) {
  float amax = 0.0f;
  for (int64_t b = 0; b < k / BLOCK; ++b) amax = std::max(amax, block_amax(x + b * BLOCK));
  const float scale = divided(amax, 127.5f);
  return scale == 0.0f ? std::numeric_limits<float>::epsilon() : scale;
}

// gguf-py's (and llama.cpp's reference) Q8_0: d = amax / 127, q = round half away from zero of x · (1 / d).
// `minus` (per-token mode, else null): instead one scale for the row (token_scale) and q = round half to even of
// x / scale, as compressed-tensors quantizes a W8A8 checkpoint's activations. Its range ends at -128, which only
// the row's most negative value reaches, when it is the largest in size: the signed dot products negate q and
// -128 has no negation in a byte, so q holds -127 there and the input's position goes to `minus`, whose missing
// -1 · code the kernel adds afterwards (PerTokenKernel).
// `paired`: the AVX-512 4-bit path's order, in which each pair of chunks (2p, 2p + 1) holds q[2p][0:16],
// q[2p + 1][0:16], q[2p][16:32], q[2p + 1][16:32], as one 64-byte decode of the pair's codes lays them out.
// `halves`: sums per 16 (two per block), for weights with 16-wide groups.
void quantize_row(const float* x, int64_t k, int8_t* q, float* d, float* sums, bool paired, bool halves,
                  std::vector<int64_t>* minus) {
  const bool per_token = minus != nullptr;
  const float row_scale = per_token ? token_scale(x, k) : 0.0f;
  for (int64_t b = 0; b < k / BLOCK; ++b) {
    const float* xb = x + b * BLOCK;
    int32_t total[2];
    if (per_token) {
      round_block_even(xb, row_scale, b * BLOCK, q + b * BLOCK, total, *minus);
      d[b] = row_scale;
    } else {
      const float scale = block_amax(xb) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
      round_block(xb, inverse, q + b * BLOCK, total);
      d[b] = static_cast<float>(at::Half(scale));
    }
    if (halves) {
      sums[2 * b] = d[b] * static_cast<float>(total[0]);
      sums[2 * b + 1] = d[b] * static_cast<float>(total[1]);
    } else {
      sums[b] = d[b] * static_cast<float>(total[0] + total[1]);
    }
  }
  if (!paired) return;
  int8_t pair[2 * BLOCK];
  for (int64_t b = 0; b + 1 < k / BLOCK; b += 2) {
    int8_t* first = q + b * BLOCK;
    for (int half = 0; half < 2; ++half)
      for (int chunk = 0; chunk < 2; ++chunk)
        std::copy_n(first + chunk * BLOCK + half * 16, 16, pair + half * 32 + chunk * 16);
    std::copy_n(pair, 2 * BLOCK, first);
  }
}
