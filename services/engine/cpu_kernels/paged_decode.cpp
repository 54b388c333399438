// Paged decode attention on the CPU: each decoding sequence's one query token attends over its
// K/V read in place from the paged cache, block by block through its block table. No gather into
// padded tensors, no mask: a sequence reads exactly its own seq_len positions.
//
// Shapes (see services/engine/attention/context.py):
//   q            (B, Hq, D)              one new token per sequence (rows may be strided)
//   k/v_cache    (N, block_size, Hkv, D) contiguous
//   block_tables (B, max_blocks) int64, seq_lens (B,) int64 (this step's token included)
//   out          (B, Hq, D)
// GQA: the G = Hq / Hkv query heads of KV head h are heads h*G .. h*G+G-1 (as repeat_interleave);
// one pass over a KV head's keys serves all G of them. Work items are sequences (or, in a batch
// shorter than the thread count, runs of a sequence's KV heads), spread over torch's intra-op threads. Scores, softmax and sums are float32 whatever the cache
// dtype (float32 or bfloat16), as SDPA's CPU kernel computes them.

#include <torch/extension.h>

#include "common.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// Row loads into float32: the only place the cache dtype matters.
inline void to_float(const float* src, float* dst, int64_t n) { std::copy(src, src + n, dst); }

inline void to_float(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  sum = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The bfloat16 cache read straight into float32 lanes (a bfloat16 is a float32's top 16 bits).
inline float dot(const float* a, const c10::BFloat16* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef __AVX512F__
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(b);
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i));
    const __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), wide, acc);
  }
  sum = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) sum += a[i] * static_cast<float>(b[i]);
  return sum;
}

inline void axpy(float w, const c10::BFloat16* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x);
  const __m512 weight = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16) {
    const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i));
    const __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(weight, wide, _mm512_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += w * static_cast<float>(x[i]);
}

inline void axpy(float w, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 weight = _mm512_set1_ps(w);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(weight, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += w * x[i];
}

template <typename T>
void decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
            const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale, torch::Tensor& out) {
  const int64_t batch = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t q_stride = q.stride(0), out_stride = out.stride(0), table_stride = block_tables.stride(0);
  const int64_t slot_stride = num_kv_heads * head_dim;  // elements between two positions' rows
  const T* q_data = q.data_ptr<T>();
  const T* k_data = k_cache.data_ptr<T>();
  const T* v_data = v_cache.data_ptr<T>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  T* out_data = out.data_ptr<T>();
  const float fscale = static_cast<float>(scale);
  // A work item is one sequence and a run of its KV heads: all of them when there are enough
  // sequences to keep every thread busy (each position's row of all heads is then read in one
  // contiguous sweep of the block), else the heads split so a short batch still uses every thread.
  const int64_t threads = at::get_num_threads();
  const int64_t chunks = batch >= threads ? 1 : std::min(num_kv_heads, (threads + batch - 1) / batch);

  at::parallel_for(0, batch * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> queries, acc, scores, top;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / chunks, c = item % chunks;
      const int64_t h0 = c * num_kv_heads / chunks, h1 = (c + 1) * num_kv_heads / chunks;
      const int64_t heads = (h1 - h0) * group;  // query heads of this item: h0*group .. h1*group-1
      const int64_t len = lens[b];
      const int64_t* table = tables + b * table_stride;
      queries.resize(heads * head_dim);
      to_float(q_data + b * q_stride + h0 * group * head_dim, queries.data(), heads * head_dim);
      for (auto& x : queries) x *= fscale;
      scores.resize(heads * len);
      top.assign(heads, -std::numeric_limits<float>::infinity());
      // Scores, block by block; position p = j * block_size + offset.
      for (int64_t j = 0, p = 0; p < len; ++j) {
        const T* block = k_data + table[j] * block_size * slot_stride + h0 * head_dim;
        for (int64_t offset = 0; offset < block_size && p < len; ++offset, ++p) {
          const T* keys = block + offset * slot_stride;
          for (int64_t qh = 0; qh < heads; ++qh) {
            const float s = dot(queries.data() + qh * head_dim, keys + (qh / group) * head_dim, head_dim);
            scores[qh * len + p] = s;
            top[qh] = std::max(top[qh], s);
          }
        }
      }
      for (int64_t qh = 0; qh < heads; ++qh) {
        float total = 0.f;
        float* s = scores.data() + qh * len;
        for (int64_t p = 0; p < len; ++p) {
          s[p] = std::exp(s[p] - top[qh]);
          total += s[p];
        }
        const float inv = 1.f / total;
        for (int64_t p = 0; p < len; ++p) s[p] *= inv;
      }
      acc.assign(heads * head_dim, 0.f);
      for (int64_t j = 0, p = 0; p < len; ++j) {
        const T* block = v_data + table[j] * block_size * slot_stride + h0 * head_dim;
        for (int64_t offset = 0; offset < block_size && p < len; ++offset, ++p) {
          const T* values = block + offset * slot_stride;
          for (int64_t qh = 0; qh < heads; ++qh) {
            axpy(scores[qh * len + p], values + (qh / group) * head_dim, acc.data() + qh * head_dim, head_dim);
          }
        }
      }
      T* o = out_data + b * out_stride + h0 * group * head_dim;
      for (int64_t i = 0; i < heads * head_dim; ++i) o[i] = static_cast<T>(acc[i]);
    }
  });
}

torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "q must be (B, Hq, D) with dense rows");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches differ in shape");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0, "head shapes do not match");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64,
              "block_tables and seq_lens must be int64");
  TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous(), "block_tables rows must be dense");
  TORCH_CHECK(block_tables.size(0) == q.size(0) && seq_lens.size(0) == q.size(0), "one table and length per query");
  auto out = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  if (q.scalar_type() == torch::kFloat32) {
    decode<float>(q, k_cache, v_cache, block_tables, seq_lens, scale, out);
  } else if (q.scalar_type() == torch::kBFloat16) {
    decode<c10::BFloat16>(q, k_cache, v_cache, block_tables, seq_lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_decode supports float32 and bfloat16, got ", q.scalar_type());
  }
  return out;
}

}  // namespace

void register_paged_decode(pybind11::module& m) {
  m.def("paged_decode", &paged_decode, kReleaseGil, "paged decode attention over the cache in place (CPU)");
}
