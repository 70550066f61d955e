// Paged attention and KV store for CPUs, reading the engine's cache in place.
//
// Cache layout (llmctl.engine.layers.attention.KVCache): [num_blocks, block_size, 2, KVH, D],
// so a token's K and V sit side by side. Queries are flat [T, H, D]: the new tokens of
// every sequence one after another (query_start_loc [B + 1] says where each starts), and
// a sequence's new tokens are the last ones of its seq_lens[b] cached tokens (causal).
//
// One work item is (a run of up to TOKENS_PER_ITEM query tokens of one sequence, a span of
// KV heads): for each token it walks the keys once for all the query heads that share those
// KV heads (GQA), keeps the scores in a per-item buffer, takes an exact softmax, then walks
// the values once. Items run on torch's own OpenMP threads, so
// torch.set_num_threads governs this kernel as it does the GEMMs. Sums are in float32.
//
// Built on first use by llmctl/kernels/cpu.py (torch.utils.cpp_extension) and cached.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cmath>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t TOKENS_PER_ITEM = 16;

struct Item {
  int64_t seq;
  int64_t token_begin;  // rows of the flat query
  int64_t token_end;
};

template <typename T>
inline float to_float(T value) {
  return static_cast<float>(value);
}

// DIM > 0: the head size as a compile-time constant (fully unrolled, vectorized rows); 0: `dim`.
template <int DIM>
inline float dot(const float* a, const float* b, int64_t dim) {
  const int64_t n = DIM > 0 ? DIM : dim;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

template <int DIM>
inline void add_scaled(float* acc, float p, const float* v, int64_t dim) {
  const int64_t n = DIM > 0 ? DIM : dim;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] += p * v[i];
}

// Scores of one query head -> unnormalized probabilities in place; returns their sum.
// `sink` (gpt-oss): a logit of no key's, in the softmax's denominator only; nullptr: none.
inline float exponentiate(float* row, int64_t n, const float* sink) {
  float top = row[0];
  for (int64_t j = 1; j < n; ++j) top = std::max(top, row[j]);
  if (sink) top = std::max(top, *sink);
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    row[j] = std::exp(row[j] - top);  // vectorized through libmvec (-ffast-math)
    sum += row[j];
  }
  return sink ? sum + std::exp(*sink - top) : sum;
}

// A row as float32: float rows are read in place, others converted into `buffer`.
template <typename T>
inline const float* as_float(const T* src, float* buffer, int64_t n) {
  for (int64_t i = 0; i < n; ++i) buffer[i] = to_float(src[i]);
  return buffer;
}

template <>
inline const float* as_float<float>(const float* src, float*, int64_t) {
  return src;
}


// f(j, slot, run) for each run of keys first .. first + count - 1 that sits in one block
// (slots slot .. slot + run - 1 are consecutive in the cache).
template <typename F>
inline void for_each_run(const int32_t* table, int64_t block_size, int64_t first, int64_t count, F&& f) {
  for (int64_t j = 0, pos = first; j < count;) {
    const int64_t offset = pos % block_size;
    const int64_t run = std::min(block_size - offset, count - j);
    f(j, static_cast<int64_t>(table[pos / block_size]) * block_size + offset, run);
    j += run;
    pos += run;
  }
}

// f(j, slot) for keys first .. first + count - 1 of a sequence, one key at a time.
template <typename F>
inline void for_each_slot(const int32_t* table, int64_t block_size, int64_t first, int64_t count, F&& f) {
  for_each_run(table, block_size, first, count, [&](int64_t j, int64_t slot, int64_t run) {
    for (int64_t r = 0; r < run; ++r) f(j + r, slot + r);
  });
}

#if defined(__AVX512F__)
// Rows of DIM (a multiple of 16) as float32 in AVX-512 registers (any cache dtype), a block's consecutive slots at a
// time: the query rows stay in registers and each key or value row is loaded once for the G
// query heads that share its KV head. With items spanning all KV heads this took SmolLM2's
// decode attention from 37 to 25 ms a step (benchmarks/cpu_attention.py), and loading each row
// once for its G = 3 query heads instead of once per head from 25 to 24; the same spans through
// the plain loops were slower than one KV head per item, which is why the plain path keeps that.
constexpr bool kVectorRows = true;
constexpr int kLanes = 16;

// 16 cache elements as float32: bfloat16 is float32's upper half (a shift), float16 converts in hardware,
// so bfloat16 and float16 caches run the same register rows as float32 with half the bytes read.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The horizontal sums of four vectors as one 4-float vector: fewer shuffles than four reductions.
inline __m128 reduce4(const __m512 v[4]) {
  // In each 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for v0, v1 (and v2, v3), then the four lane sums.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
  const __m512 sums = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // Then across the four lanes.
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(sums),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// scores[g · score_stride + j] = q_g · key_j for G query rows (DIM floats each) and `count`
// consecutive keys `stride` elements apart.
template <int DIM, int G, typename T>
inline void block_dots(const float* q, const T* key, int64_t stride, int64_t count, float* scores,
                       int64_t score_stride) {
  constexpr int C = DIM / 16;
  constexpr bool kFourKeys = G * C + 4 * G <= 28;  // the query rows and four keys' sums fit the 32 registers
  __m512 qv[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) qv[g][c] = _mm512_loadu_ps(q + g * DIM + 16 * c);
  int64_t j = 0;
  if constexpr (kFourKeys) {
    for (; j + 4 <= count; j += 4, key += 4 * stride) {
      __m512 sum[G][4];
      for (int r = 0; r < 4; ++r) {
        const T* row = key + r * stride;
        const __m512 k0 = load16(row);
        for (int g = 0; g < G; ++g) sum[g][r] = _mm512_mul_ps(qv[g][0], k0);
        for (int c = 1; c < C; ++c) {
          const __m512 k = load16(row + 16 * c);
          for (int g = 0; g < G; ++g) sum[g][r] = _mm512_fmadd_ps(qv[g][c], k, sum[g][r]);
        }
      }
      for (int g = 0; g < G; ++g) _mm_storeu_ps(scores + g * score_stride + j, reduce4(sum[g]));
    }
  }
  for (; j < count; ++j, key += stride) {
    __m512 sum[G];
    const __m512 k0 = load16(key);
    for (int g = 0; g < G; ++g) sum[g] = _mm512_mul_ps(qv[g][0], k0);
    for (int c = 1; c < C; ++c) {
      const __m512 k = load16(key + 16 * c);
      for (int g = 0; g < G; ++g) sum[g] = _mm512_fmadd_ps(qv[g][c], k, sum[g]);
    }
    for (int g = 0; g < G; ++g) scores[g * score_stride + j] = _mm512_reduce_add_ps(sum[g]);
  }
}

// acc_g += Σ_j p[g · p_stride + j] · value_j for G accumulator rows (DIM floats each) and `count`
// consecutive values `stride` elements apart.
template <int DIM, int G, typename T>
inline void block_weighted_sum(const float* p, int64_t p_stride, const T* value, int64_t stride, int64_t count,
                               float* acc) {
  constexpr int C = DIM / 16;
  __m512 sum[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) sum[g][c] = _mm512_loadu_ps(acc + g * DIM + 16 * c);
  for (int64_t j = 0; j < count; ++j, value += stride) {
    __m512 weight[G];
    for (int g = 0; g < G; ++g) weight[g] = _mm512_set1_ps(p[g * p_stride + j]);
    for (int c = 0; c < C; ++c) {
      const __m512 v = load16(value + 16 * c);
      for (int g = 0; g < G; ++g) sum[g][c] = _mm512_fmadd_ps(weight[g], v, sum[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + g * DIM + 16 * c, sum[g][c]);
}

// f(std::integral_constant<int, G>{}): G = `group` (the query heads per KV head) where their
// query rows fit half the registers, else 1 (each head on its own).
template <int DIM, typename F>
inline void with_heads_per_row(int64_t group, F&& f) {
  constexpr int C = DIM / 16;
  switch (group) {
    case 2:
      if constexpr (2 * C <= 16) return f(std::integral_constant<int, 2>{});
      break;
    case 3:
      if constexpr (3 * C <= 16) return f(std::integral_constant<int, 3>{});
      break;
    case 4:
      if constexpr (4 * C <= 16) return f(std::integral_constant<int, 4>{});
      break;
    default:
      break;
  }
  f(std::integral_constant<int, 1>{});
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "cpu_attention_avx2.h"  // the same rows in AVX2 registers
#else
constexpr bool kVectorRows = false;
constexpr int kLanes = 16;
template <int DIM, int G, typename T>
inline void block_dots(const float*, const T*, int64_t, int64_t, float*, int64_t) {}
template <int DIM, int G, typename T>
inline void block_weighted_sum(const float*, int64_t, const T*, int64_t, int64_t, float*) {}
template <int DIM, typename F>
inline void with_heads_per_row(int64_t, F&& f) { f(std::integral_constant<int, 1>{}); }
#endif

std::vector<Item> split_items(const int32_t* starts, int64_t num_seqs) {
  std::vector<Item> items;
  for (int64_t b = 0; b < num_seqs; ++b) {
    for (int64_t t = starts[b]; t < starts[b + 1]; t += TOKENS_PER_ITEM) {
      items.push_back({b, t, std::min<int64_t>(t + TOKENS_PER_ITEM, starts[b + 1])});
    }
  }
  return items;
}

// KV heads per work item (AVX-512 float rows only; the plain loops were slower with more than
// one): all of them, for contiguous reads, while that still gives every thread a few items,
// else fewer.
int64_t kv_heads_per_item(int64_t kv_heads, int64_t items) {
  const int64_t wanted = 4 * static_cast<int64_t>(at::get_num_threads());
  for (int64_t span = kv_heads; span > 1; --span) {
    if (kv_heads % span == 0 && items * (kv_heads / span) >= wanted) return span;
  }
  return 1;
}

// T: the query's and output's dtype; C: the cache's (T, or bfloat16/float16 under float32 queries).
template <typename T, typename C, int DIM>
void attend(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
            const at::Tensor& seq_lens, const at::Tensor& query_start_loc, double scale,
            const c10::optional<at::Tensor>& alibi_slopes, int64_t sliding_window, double softcap,
            const c10::optional<at::Tensor>& sinks, int64_t chunk) {
  const int64_t heads = query.size(1), dim = query.size(2);
  const float cap = static_cast<float>(softcap);
  const int64_t block_size = kv_cache.size(1), kv_heads = kv_cache.size(3);
  const int64_t group = heads / kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const T* q_ptr = query.data_ptr<T>();
  const C* kv_ptr = kv_cache.data_ptr<C>();
  T* out_ptr = out.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  const float* slopes = alibi_slopes.has_value() ? alibi_slopes->data_ptr<float>() : nullptr;
  const float* sink_logits = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  const int64_t q_token_stride = query.stride(0), q_head_stride = query.stride(1);
  const int64_t o_token_stride = out.stride(0), o_head_stride = out.stride(1);
  const int64_t slot_stride = 2 * kv_heads * dim;  // one token's K and V
  const std::vector<Item> items = split_items(starts, seq_lens.size(0));
  // A work item covers `span` KV heads, so that it reads each cached token's K (and V) rows
  // of those heads as one contiguous run.
  constexpr bool vector_rows = kVectorRows && DIM > 0 && DIM % kLanes == 0 &&
      (std::is_same_v<C, float> || std::is_same_v<C, c10::BFloat16> || std::is_same_v<C, c10::Half>);
  const int64_t span = vector_rows ? kv_heads_per_item(kv_heads, static_cast<int64_t>(items.size())) : 1;
  const int64_t spans = kv_heads / span;
  const int64_t num_work = static_cast<int64_t>(items.size()) * spans;
  const int64_t q_heads = span * group;  // query heads per work item

  // Items differ in context length: hand them out dynamically, on torch's OpenMP threads.
#pragma omp parallel num_threads(at::get_num_threads())
  {
    std::vector<float> q(q_heads * dim), acc(q_heads * dim), row(dim), scores, sums(q_heads);
#pragma omp for schedule(dynamic, 1)
    for (int64_t work = 0; work < num_work; ++work) {
      const Item& item = items[work / spans];
      const int64_t first_head = (work % spans) * q_heads;  // of the query heads
      const int64_t first_query_pos = lens[item.seq] - (starts[item.seq + 1] - starts[item.seq]);
      const int32_t* table = tables + item.seq * max_blocks;
      // Query head h reads KV head h / group: its K row, and its V row kv_heads rows further.
      auto k_row = [&](int64_t h) { return kv_ptr + ((first_head + h) / group) * dim; };
      auto v_row = [&](int64_t h) { return kv_ptr + (kv_heads + (first_head + h) / group) * dim; };
      for (int64_t token = item.token_begin; token < item.token_end; ++token) {
        const int64_t pos = first_query_pos + (token - starts[item.seq]);
        int64_t first_key = sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
        if (chunk > 0) first_key = std::max<int64_t>(first_key, pos / chunk * chunk);  // Llama 4: its own chunk
        const int64_t num_keys = pos + 1 - first_key;
        scores.resize(q_heads * num_keys);
        for (int64_t h = 0; h < q_heads; ++h) {  // the scale folded into q
          const T* src = q_ptr + token * q_token_stride + (first_head + h) * q_head_stride;
          for (int64_t d = 0; d < dim; ++d) q[h * dim + d] = to_float(src[d]) * static_cast<float>(scale);
        }
        if constexpr (vector_rows) {
          with_heads_per_row<DIM>(group, [&](auto heads) {
            constexpr int G = decltype(heads)::value;
            for_each_run(table, block_size, first_key, num_keys, [&](int64_t j, int64_t slot, int64_t run) {
              for (int64_t h = 0; h < q_heads; h += G) {
                block_dots<DIM, G>(q.data() + h * dim, k_row(h) + slot * slot_stride, slot_stride, run,
                                   scores.data() + h * num_keys + j, num_keys);
              }
            });
          });
        } else {
          for_each_slot(table, block_size, first_key, num_keys, [&](int64_t j, int64_t slot) {
            for (int64_t h = 0; h < q_heads; h += group) {
              const float* k = as_float(k_row(h) + slot * slot_stride, row.data(), dim);  // read once for the group
              for (int64_t g = h; g < h + group; ++g) scores[g * num_keys + j] = dot<DIM>(q.data() + g * dim, k, dim);
            }
          });
        }
        for (int64_t h = 0; h < q_heads; ++h) {
          float* head_scores = scores.data() + h * num_keys;
          if (cap > 0.f) {  // Gemma 2: cap · tanh(score / cap), on the scaled score
            for (int64_t j = 0; j < num_keys; ++j) head_scores[j] = cap * std::tanh(head_scores[j] / cap);
          }
          if (slopes) {  // ALiBi as BLOOM adds it: slope · key position
            const float slope = slopes[first_head + h];
            for (int64_t j = 0; j < num_keys; ++j) head_scores[j] += slope * static_cast<float>(first_key + j);
          }
          sums[h] = exponentiate(head_scores, num_keys, sink_logits ? sink_logits + first_head + h : nullptr);
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        if constexpr (vector_rows) {
          with_heads_per_row<DIM>(group, [&](auto heads) {
            constexpr int G = decltype(heads)::value;
            for_each_run(table, block_size, first_key, num_keys, [&](int64_t j, int64_t slot, int64_t run) {
              for (int64_t h = 0; h < q_heads; h += G) {
                block_weighted_sum<DIM, G>(scores.data() + h * num_keys + j, num_keys, v_row(h) + slot * slot_stride,
                                           slot_stride, run, acc.data() + h * dim);
              }
            });
          });
        } else {
          for_each_slot(table, block_size, first_key, num_keys, [&](int64_t j, int64_t slot) {
            for (int64_t h = 0; h < q_heads; h += group) {
              const float* v = as_float(v_row(h) + slot * slot_stride, row.data(), dim);  // read once for the group
              for (int64_t g = h; g < h + group; ++g) add_scaled<DIM>(acc.data() + g * dim, scores[g * num_keys + j], v, dim);
            }
          });
        }
        for (int64_t h = 0; h < q_heads; ++h) {
          T* dst = out_ptr + token * o_token_stride + (first_head + h) * o_head_stride;
          const float inverse = 1.f / sums[h];
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<T>(acc[h * dim + d] * inverse);
        }
      }
    }
  }
}

// The common head sizes get fully unrolled rows; others take the runtime-size loop.
template <typename T, typename C>
void attend_any_dim(at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
                    const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                    double scale, const c10::optional<at::Tensor>& alibi_slopes, int64_t sliding_window,
                    double softcap, const c10::optional<at::Tensor>& sinks, int64_t chunk) {
  auto run = [&](auto dim) {
    attend<T, C, decltype(dim)::value>(out, query, kv_cache, block_tables, seq_lens, query_start_loc, scale,
                                    alibi_slopes, sliding_window, softcap, sinks, chunk);
  };
  switch (query.size(2)) {
    case 64: run(std::integral_constant<int, 64>{}); break;
    case 80: run(std::integral_constant<int, 80>{}); break;
    case 96: run(std::integral_constant<int, 96>{}); break;
    case 128: run(std::integral_constant<int, 128>{}); break;
    default: run(std::integral_constant<int, 0>{});
  }
}

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu paged_attention: ", message); }

// A float32 model over a bfloat16 or float16 cache (--kv-cache-dtype): half the bytes each step reads.
bool narrower_cache(const at::Tensor& rows, const at::Tensor& kv_cache) {
  return rows.scalar_type() == at::kFloat &&
         (kv_cache.scalar_type() == at::kHalf || kv_cache.scalar_type() == at::kBFloat16);
}

// n float32 values into the cache's dtype (rounded to nearest even).
template <typename C>
void narrow_row(const float* src, C* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<C>(src[i]);
}

void paged_attention(at::Tensor out, const at::Tensor& query, const at::Tensor& kv_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                     double scale, const c10::optional<at::Tensor>& alibi_slopes, int64_t sliding_window,
                     double softcap, const c10::optional<at::Tensor>& sinks, int64_t chunk) {
  check(query.dim() == 3 && out.sizes() == query.sizes(), "query and out are [T, H, D]");
  check(query.stride(2) == 1 && out.stride(2) == 1, "query and out rows must be contiguous");
  check(kv_cache.dim() == 5 && kv_cache.is_contiguous(), "kv_cache is a contiguous [blocks, block_size, 2, KVH, D]");
  check(out.scalar_type() == query.scalar_type(), "query and out share one dtype");
  check(kv_cache.scalar_type() == query.scalar_type() || narrower_cache(query, kv_cache),
        "kv_cache has the query's dtype, or bfloat16/float16 under float32 queries");
  check(query.size(1) % kv_cache.size(3) == 0 && query.size(2) == kv_cache.size(4), "heads do not match the cache");
  for (const at::Tensor* t : {&block_tables, &seq_lens, &query_start_loc}) {
    check(t->scalar_type() == at::kInt && t->is_contiguous(), "block tables and lengths are contiguous int32");
  }
  check(!alibi_slopes.has_value() || (alibi_slopes->scalar_type() == at::kFloat && alibi_slopes->numel() == query.size(1)),
        "alibi_slopes is float32 [H]");
  check(!sinks.has_value() || (sinks->scalar_type() == at::kFloat && sinks->is_contiguous() &&
                               sinks->numel() == query.size(1)), "sinks is a contiguous float32 [H]");
  auto run = [&](auto query_type, auto cache_type) {
    attend_any_dim<decltype(query_type), decltype(cache_type)>(out, query, kv_cache, block_tables, seq_lens,
                                                                query_start_loc, scale, alibi_slopes, sliding_window,
                                                                softcap, sinks, chunk);
  };
  if (kv_cache.scalar_type() == at::kHalf && query.scalar_type() == at::kFloat) return run(float{}, c10::Half{});
  if (kv_cache.scalar_type() == at::kBFloat16 && query.scalar_type() == at::kFloat)
    return run(float{}, c10::BFloat16{});
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention",
                                  [&] { run(scalar_t{}, scalar_t{}); });
}

// store_kv's float32 rows into a bfloat16 or float16 cache.
void store_narrowed(at::Tensor& kv_cache, const at::Tensor& slots, const at::Tensor& key, const at::Tensor& value) {
  const int64_t row = key.size(1) * key.size(2);
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  const float* k = key.data_ptr<float>();
  const float* v = value.data_ptr<float>();
  const int64_t k_stride = key.stride(0), v_stride = value.stride(0);
  auto store = [&](auto* cache) {
    at::parallel_for(0, key.size(0), 64, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (slot_ptr[t] < 0) continue;
        narrow_row(k + t * k_stride, cache + slot_ptr[t] * 2 * row, row);
        narrow_row(v + t * v_stride, cache + slot_ptr[t] * 2 * row + row, row);
      }
    });
  };
  if (kv_cache.scalar_type() == at::kHalf) return store(kv_cache.data_ptr<c10::Half>());
  store(kv_cache.data_ptr<c10::BFloat16>());
}

// New K/V [T, KVH, D] into their cache slots; slot -1 skips the token. Each token's K (and V)
// row of KVH x D must be contiguous, tokens may be any stride apart: K and V can be views of
// the fused QKV projection's output, so the layers do not copy them first.
void store_kv(at::Tensor kv_cache, const at::Tensor& slots, const at::Tensor& key, const at::Tensor& value) {
  check(kv_cache.is_contiguous(), "store_kv needs a contiguous cache");
  for (const at::Tensor* t : {&key, &value}) {
    check(t->dim() == 3 && t->stride(2) == 1 && t->stride(1) == t->size(2), "each token's K and V rows are contiguous");
  }
  check(slots.scalar_type() == at::kLong, "slots are int64");
  check(key.scalar_type() == value.scalar_type(), "key and value share one dtype");
  if (key.scalar_type() != kv_cache.scalar_type()) {
    check(narrower_cache(key, kv_cache), "key, value and cache share one dtype, or float32 rows go to a bfloat16/float16 cache");
    return store_narrowed(kv_cache, slots, key, value);
  }
  const int64_t row = key.size(1) * key.size(2);  // one token's K (or V)
  const int64_t bytes = row * key.element_size();
  const int64_t k_stride = key.stride(0) * key.element_size(), v_stride = value.stride(0) * value.element_size();
  const int64_t* slot_ptr = slots.data_ptr<int64_t>();
  char* cache = static_cast<char*>(kv_cache.data_ptr());
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  at::parallel_for(0, key.size(0), 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (slot_ptr[t] < 0) continue;
      char* dst = cache + slot_ptr[t] * 2 * bytes;
      std::copy(k + t * k_stride, k + t * k_stride + bytes, dst);
      std::copy(v + t * v_stride, v + t * v_stride + bytes, dst + bytes);
    }
  });
}

}  // namespace

TORCH_LIBRARY(llmctl_cpu, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor query_start_loc, float scale, Tensor? alibi_slopes, int sliding_window, float softcap, "
        "Tensor? sinks=None, int chunk=0) -> ()");
  m.def("store_kv(Tensor(a!) kv_cache, Tensor slots, Tensor key, Tensor value) -> ()");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("store_kv", &store_kv);
}
