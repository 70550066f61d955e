// Included by cpu_attention.cpp inside its anonymous namespace, where the CPU has AVX2/FMA/F16C but the
// build has no AVX-512: block_dots, block_weighted_sum and with_heads_per_row as the AVX-512 ones, in
// 8-float registers.
#pragma once

// The same register rows in AVX2's 8-float registers, for CPUs without AVX-512: 16 registers, so query
// heads share a row pass only while their rows fit half of them (G · DIM / 8 ≤ 8).
constexpr bool kVectorRows = true;
constexpr int kLanes = 8;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline __m256 load8(const c10::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline float reduce1(__m256 v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
}

// The horizontal sums of four vectors as one 4-float vector.
inline __m128 reduce4(const __m256 v[4]) {
  const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  return _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps(sums, 1));
}

template <int DIM, int G, typename T>
inline void block_dots(const float* q, const T* key, int64_t stride, int64_t count, float* scores,
                       int64_t score_stride) {
  constexpr int C = DIM / kLanes;
  constexpr bool kFourKeys = G * C + 4 * G <= 13;  // the query rows and four keys' sums fit the 16 registers
  __m256 qv[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) qv[g][c] = _mm256_loadu_ps(q + g * DIM + kLanes * c);
  int64_t j = 0;
  if constexpr (kFourKeys) {
    for (; j + 4 <= count; j += 4, key += 4 * stride) {
      __m256 sum[G][4];
      for (int r = 0; r < 4; ++r) {
        const T* row = key + r * stride;
        const __m256 k0 = load8(row);
        for (int g = 0; g < G; ++g) sum[g][r] = _mm256_mul_ps(qv[g][0], k0);
        for (int c = 1; c < C; ++c) {
          const __m256 k = load8(row + kLanes * c);
          for (int g = 0; g < G; ++g) sum[g][r] = _mm256_fmadd_ps(qv[g][c], k, sum[g][r]);
        }
      }
      for (int g = 0; g < G; ++g) _mm_storeu_ps(scores + g * score_stride + j, reduce4(sum[g]));
    }
  }
  for (; j < count; ++j, key += stride) {
    __m256 sum[G];
    const __m256 k0 = load8(key);
    for (int g = 0; g < G; ++g) sum[g] = _mm256_mul_ps(qv[g][0], k0);
    for (int c = 1; c < C; ++c) {
      const __m256 k = load8(key + kLanes * c);
      for (int g = 0; g < G; ++g) sum[g] = _mm256_fmadd_ps(qv[g][c], k, sum[g]);
    }
    for (int g = 0; g < G; ++g) scores[g * score_stride + j] = reduce1(sum[g]);
  }
}

template <int DIM, int G, typename T>
inline void block_weighted_sum(const float* p, int64_t p_stride, const T* value, int64_t stride, int64_t count,
                               float* acc) {
  constexpr int C = DIM / kLanes;
  __m256 sum[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) sum[g][c] = _mm256_loadu_ps(acc + g * DIM + kLanes * c);
  for (int64_t j = 0; j < count; ++j, value += stride) {
    __m256 weight[G];
    for (int g = 0; g < G; ++g) weight[g] = _mm256_set1_ps(p[g * p_stride + j]);
    for (int c = 0; c < C; ++c) {
      const __m256 v = load8(value + kLanes * c);
      for (int g = 0; g < G; ++g) sum[g][c] = _mm256_fmadd_ps(weight[g], v, sum[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(acc + g * DIM + kLanes * c, sum[g][c]);
}

template <int DIM, typename F>
inline void with_heads_per_row(int64_t group, F&& f) {
  constexpr int C = DIM / kLanes;
  switch (group) {
    case 2:
      if constexpr (2 * C <= 8) return f(std::integral_constant<int, 2>{});
      break;
    case 4:
      if constexpr (4 * C <= 8) return f(std::integral_constant<int, 4>{});
      break;
    default:
      break;
  }
  f(std::integral_constant<int, 1>{});
}
