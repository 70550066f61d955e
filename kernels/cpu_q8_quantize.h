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
  const __m256i first = _mm256_add_epi32(ints[0], ints[1]), second = _mm256_add_epi32(ints[2], ints[3]);
  total[0] = sum8_int(first);
  total[1] = sum8_int(second);
  // packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(ints[0], ints[1]), _mm256_packs_epi32(ints[2], ints[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  total[0] = total[1] = 0;
  for (int j = 0; j < BLOCK; ++j) {
    const int32_t v = static_cast<int32_t>(std::round(xb[j] * inverse));
    q[j] = static_cast<int8_t>(v);
    total[j / 16] += v;
  }
#endif
}

// gguf-py's (and llama.cpp's reference) Q8_0: d = amax / 127, q = round half away from zero of x · (1 / d).
// `paired`: the AVX-512 4-bit path's order, in which each pair of chunks (2p, 2p + 1) holds q[2p][0:16],
// q[2p + 1][0:16], q[2p][16:32], q[2p + 1][16:32], as one 64-byte decode of the pair's codes lays them out.
// `halves`: sums per 16 (two per block), for weights with 16-wide groups.
void quantize_row(const float* x, int64_t k, int8_t* q, float* d, float* sums, bool paired, bool halves) {
  for (int64_t b = 0; b < k / BLOCK; ++b) {
    const float* xb = x + b * BLOCK;
    const float amax = block_amax(xb);
    const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    int32_t total[2];
    round_block(xb, inverse, q + b * BLOCK, total);
    d[b] = static_cast<float>(at::Half(scale));
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
