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
// shorter than the thread count, runs of a sequence's KV heads), spread over torch's intra-op
// threads. Scores, softmax and sums are float32 whatever the cache dtype (float32 or bfloat16),
// as SDPA's CPU kernel computes them.
//
// With AVX-512 and head_dim 64 or 128 (G <= 8 / 4), `kv_heads` takes all KV heads of a work item
// in one pass over each 16-position chunk of its rows: each key and value row is read once for its
// G query heads, scores 16 positions at a time (vdpbf16ps on a bfloat16 cache where the CPU has
// avx512_bf16), the softmax's exp vectorised, and the rows ahead asked into L2 (`RowStream`),
// which is what counts when the cache comes from memory, as in a real step. Its first form (one
// KV head at a time, no prefetch) took 0.35-0.6x the time of the general loop below (which widens
// a row once per query head and accumulates through memory) on the default model's shapes,
// 16 sequences of 150 or 700 positions; docs/benchmarks.md has each step since. Without AVX-512,
// the general loop's dot products, value sums and softmax use 8-lane AVX2 and FMA where the CPU
// has them (a layer of 64 float32 sequences of 32-384 positions on an AVX2 EPYC: 3.3-3.9 ms scalar,
// 1.2-1.6 ms with them; bfloat16 4.3-4.4 and 1.0-1.9 ms).

#include <torch/extension.h>

#include "common.h"
#include "ops.h"
#include "simd.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using turnout_simd::to_float;
#ifdef __AVX512F__
using turnout_simd::exp16;
using turnout_simd::load16;
using turnout_simd::store16;
#endif

#ifdef TURNOUT_SIMD_AVX2
// The sum of a[j] * b[j] over the whole 8-lane vectors from 0, two accumulators so the FMAs
// overlap; `i` is left at the first element not summed, for the caller's scalar tail.
template <typename T>
inline float dot8(const float* a, const T* b, int64_t n, int64_t& i) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), turnout_simd::load8(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), turnout_simd::load8(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), turnout_simd::load8(b + i), acc0);
  return turnout_simd::sum8(_mm256_add_ps(acc0, acc1));
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.f;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  sum = _mm512_reduce_add_ps(acc);
#elif defined(TURNOUT_SIMD_AVX2)
  sum = dot8(a, b, n, i);
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
#elif defined(TURNOUT_SIMD_AVX2)
  sum = dot8(a, b, n, i);
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
#elif defined(TURNOUT_SIMD_AVX2)
  const __m256 weight = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(weight, turnout_simd::load8(x + i), _mm256_loadu_ps(y + i)));
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
#elif defined(TURNOUT_SIMD_AVX2)
  const __m256 weight = _mm256_set1_ps(w);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(weight, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += w * x[i];
}

// s[0..len) <- softmax(s), in place, `top` the largest of them: the general path's (no AVX-512).
inline void softmax_general(float* s, int64_t len, float top) {
  float total = 0.f;
  int64_t p = 0;
#ifdef TURNOUT_SIMD_AVX2
  const __m256 shift = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  for (; p + 8 <= len; p += 8) {
    const __m256 e = turnout_simd::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), shift));
    _mm256_storeu_ps(s + p, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = turnout_simd::sum8(sum);
#endif
  for (; p < len; ++p) {
    s[p] = std::exp(s[p] - top);
    total += s[p];
  }
  const float inv = 1.f / total;
  for (p = 0; p < len; ++p) s[p] *= inv;
}

#ifdef __AVX512F__
// s[0..len) <- softmax(s), in place.
inline void softmax(float* s, int64_t len, float top) {
  const __m512 shift = _mm512_set1_ps(top);
  __m512 total = _mm512_setzero_ps();
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 mask = len - p >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - p)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + p), shift));
    _mm512_mask_storeu_ps(s + p, mask, e);
    total = _mm512_mask_add_ps(total, mask, total, e);
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total));
  for (int64_t p = 0; p < len; p += 16) {
    const __mmask16 mask = len - p >= 16 ? 0xffff : static_cast<__mmask16>((1u << (len - p)) - 1);
    _mm512_mask_storeu_ps(s + p, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, s + p), inv));
  }
}

// Lane i of the result: the sum of the 16 lanes of a[i]. A tree of in-register shuffles and adds,
// ~45 instructions for the 16 sums where one _mm512_reduce_add_ps each costs ~8.
inline __m512 sum_lanes16(const __m512 a[16]) {
  __m512 pairs[8];  // per 128-bit chunk: [x0+x2, y0+y2, x1+x3, y1+y3] of inputs x = a[2i], y = a[2i+1]
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  __m512 quads[4];  // per chunk c: the sums over chunk c of inputs 4i .. 4i+3
  for (int i = 0; i < 4; ++i) {
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  }
  // Chunks (0+1, 2+3) of quads[0], then of quads[1] (and of [2], [3]); then the two halves added.
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

// The rows of one sequence's cache that kv_heads reads, as a stream of 16-position chunks: its K
// chunks, then its V chunks, then the next work item's K chunks. Chunk u + kAhead is asked into
// L2 while chunk u is computed: a decode step reads every layer's cache once (~270 MB in
// bfloat16 at 64 sequences of ~190 positions), and without it each block's first lines arrived
// only when asked for, so reading and computing took turns (bfloat16, 30 layers, 64 such
// sequences, caches from memory: one thread 39.5 -> 21-24 ms, two threads 22.0 -> 11.7 ms).
template <typename T>
struct RowStream {
  const T *k, *v;  // the caches at the item's first KV head, position 0 of block 0
  const int64_t* table;
  int64_t len;
  const int64_t* next_table;  // the next item this thread takes, over the same KV heads (null: none)
  int64_t next_len;
  int64_t block_size, slot_stride, bytes;  // bytes: of each row, the item's KV heads

  static constexpr int64_t kAhead = 2;

  static int64_t chunks(int64_t positions) { return (positions + 15) / 16; }

  void prefetch(int64_t u) const {
    const int64_t n = chunks(len);
    const bool own = u < 2 * n;
    const T* base = own && u >= n ? v : k;
    const int64_t* t = own ? table : next_table;
    const int64_t positions = own ? len : next_len;
    const int64_t p0 = 16 * (own ? u % n : u - 2 * n);
    if (t == nullptr || p0 >= positions) return;
    for (int64_t p = p0; p < std::min(p0 + 16, positions); ++p) {
      turnout_simd::prefetch_l2(base + (t[p / block_size] * block_size + p % block_size) * slot_stride, bytes);
    }
  }
};

// dots[i] (16 lanes, summed later) of query head `query` (D elements) with rows[i] + offset, i < count.
template <typename T, int64_t D>
inline void dot_rows(const T* query, const T* const rows[16], int64_t offset, int64_t count, __m512 dots[16]) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    // vdpbf16ps straight on the bfloat16 pairs: no widening; products exact in float32.
    __m512bh q[D / 32];
    for (int64_t j = 0; j < D / 32; ++j) q[j] = (__m512bh)_mm512_loadu_si512(query + 32 * j);
    for (int64_t i = 0; i < 16; ++i) {
      dots[i] = _mm512_setzero_ps();
      if (i < count) {
        for (int64_t j = 0; j < D / 32; ++j) {
          dots[i] = _mm512_dpbf16_ps(dots[i], q[j], (__m512bh)_mm512_loadu_si512(rows[i] + offset + 32 * j));
        }
      }
    }
    return;
  }
#endif
  __m512 q[D / 16];
  for (int64_t j = 0; j < D / 16; ++j) q[j] = load16(query + 16 * j);
  for (int64_t i = 0; i < 16; ++i) {
    dots[i] = _mm512_setzero_ps();
    if (i < count) {
      for (int64_t j = 0; j < D / 16; ++j) dots[i] = _mm512_fmadd_ps(q[j], load16(rows[i] + offset + 16 * j), dots[i]);
    }
  }
}

// The G query heads of each of `heads` KV heads of one sequence (head_dim D), with AVX-512. Each
// 16-position chunk is read once for all those KV heads (a position's row of them is contiguous)
// while `stream` asks for the chunks ahead. Scores: 16 positions at a time (dot_rows: vdpbf16ps on
// a bfloat16 cache where the CPU has avx512_bf16, else rows widened to float32), their 16 lane sums
// by one shuffle tree, then scaled. Softmax and the value sum in float32, each value row widened
// once for its G query heads (a vdpbf16ps value sum, weights rounded to bfloat16, measured no
// faster and had 1.5x the error); a KV head's G x D/16 sums live in `acc` between chunks.
// q: the raw (unscaled) query heads of the item, heads * G rows of D; scores: room for
// heads * G * len; top: heads * G; acc: heads * G * D; out like q.
template <typename T, int64_t D, int64_t G>
void kv_heads(const T* q, float scale, int64_t heads, const RowStream<T>& stream, float* scores, float* top,
              float* acc, T* out) {
  constexpr int64_t kV = D / 16;  // float32 vectors per row
  const int64_t len = stream.len, block_size = stream.block_size, slot_stride = stream.slot_stride;
  const int64_t* table = stream.table;
  const int64_t chunks = RowStream<T>::chunks(len), query_heads = heads * G;
  const __m512 scaling = _mm512_set1_ps(scale);
  for (int64_t u = 0; u < RowStream<T>::kAhead; ++u) stream.prefetch(u);
  for (int64_t i = 0; i < query_heads; ++i) top[i] = -std::numeric_limits<float>::infinity();
  const T* rows[16];
  auto chunk_rows = [&](const T* base, int64_t p0, int64_t count) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t p = p0 + i;
      rows[i] = base + (table[p / block_size] * block_size + p % block_size) * slot_stride;
    }
  };
  for (int64_t c = 0; c < chunks; ++c) {
    stream.prefetch(c + RowStream<T>::kAhead);
    const int64_t p0 = 16 * c, count = std::min<int64_t>(16, len - p0);
    const __mmask16 valid = count == 16 ? 0xffff : static_cast<__mmask16>((1u << count) - 1);
    chunk_rows(stream.k, p0, count);
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t qh = h * G + g;
        __m512 dots[16];
        dot_rows<T, D>(q + qh * D, rows, h * D, count, dots);
        const __m512 s = _mm512_mul_ps(sum_lanes16(dots), scaling);
        _mm512_mask_storeu_ps(scores + qh * len + p0, valid, s);
        top[qh] = std::max(top[qh], _mm512_mask_reduce_max_ps(valid, s));
      }
    }
  }
  for (int64_t qh = 0; qh < query_heads; ++qh) softmax(scores + qh * len, len, top[qh]);
  std::fill(acc, acc + query_heads * D, 0.f);
  for (int64_t c = 0; c < chunks; ++c) {
    stream.prefetch(chunks + c + RowStream<T>::kAhead);
    const int64_t p0 = 16 * c, count = std::min<int64_t>(16, len - p0);
    chunk_rows(stream.v, p0, count);
    for (int64_t h = 0; h < heads; ++h) {
      __m512 o[G][kV];
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < kV; ++i) o[g][i] = _mm512_loadu_ps(acc + (h * G + g) * D + 16 * i);
      for (int64_t r = 0; r < count; ++r) {
        __m512 value[kV];
        for (int64_t i = 0; i < kV; ++i) value[i] = load16(rows[r] + h * D + 16 * i);
        for (int64_t g = 0; g < G; ++g) {
          const __m512 w = _mm512_set1_ps(scores[(h * G + g) * len + p0 + r]);
          for (int64_t i = 0; i < kV; ++i) o[g][i] = _mm512_fmadd_ps(w, value[i], o[g][i]);
        }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t i = 0; i < kV; ++i) _mm512_storeu_ps(acc + (h * G + g) * D + 16 * i, o[g][i]);
    }
  }
  for (int64_t qh = 0; qh < query_heads; ++qh)
    for (int64_t i = 0; i < kV; ++i) store16(out + qh * D + 16 * i, _mm512_loadu_ps(acc + qh * D + 16 * i));
}

// The fast path's (D, G) instances: D/16 x G value sums must fit the registers.
template <typename T>
using KvHeadsFn = void (*)(const T*, float, int64_t, const RowStream<T>&, float*, float*, float*, T*);

template <typename T>
KvHeadsFn<T> kv_heads_kernel(int64_t head_dim, int64_t group) {
  if (head_dim == 64) {
    switch (group) {
      case 1: return kv_heads<T, 64, 1>;
      case 2: return kv_heads<T, 64, 2>;
      case 3: return kv_heads<T, 64, 3>;
      case 4: return kv_heads<T, 64, 4>;
      case 5: return kv_heads<T, 64, 5>;
      case 6: return kv_heads<T, 64, 6>;
      case 7: return kv_heads<T, 64, 7>;
      case 8: return kv_heads<T, 64, 8>;
    }
  }
  if (head_dim == 128) {
    switch (group) {
      case 1: return kv_heads<T, 128, 1>;
      case 2: return kv_heads<T, 128, 2>;
      case 3: return kv_heads<T, 128, 3>;
      case 4: return kv_heads<T, 128, 4>;
    }
  }
  return nullptr;
}
#endif

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

#ifdef __AVX512F__
  const KvHeadsFn<T> fast = kv_heads_kernel<T>(head_dim, group);
#endif
  // Items differ in cost by their sequence's length, so a contiguous split of the item range can
  // leave one thread with most of the work (64 sequences of 32-256 positions: 0.62 ms a layer
  // against ~0.33 at the cache's read bandwidth). Thread slot t takes items t, t + slots, ... of
  // the items sorted longest first, which balances the sums of lengths.
  const int64_t items = batch * chunks;
  std::vector<int64_t> order(items);
  for (int64_t i = 0; i < items; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return lens[x / chunks] > lens[y / chunks]; });
  const int64_t slots = std::max<int64_t>(1, std::min(threads, items));
  at::parallel_for(0, slots, 1, [&](int64_t first_slot, int64_t end_slot) {
    std::vector<float> queries, acc, scores, top;
    for (int64_t slot = first_slot; slot < end_slot; ++slot)
    for (int64_t k = slot; k < items; k += slots) {
      const int64_t item = order[k];
      const int64_t b = item / chunks, c = item % chunks;
      const int64_t h0 = c * num_kv_heads / chunks, h1 = (c + 1) * num_kv_heads / chunks;
      const int64_t heads = (h1 - h0) * group;  // query heads of this item: h0*group .. h1*group-1
      const int64_t len = lens[b];
      const int64_t* table = tables + b * table_stride;
#ifdef __AVX512F__
      if (fast != nullptr) {
        scores.resize(heads * len);
        top.resize(heads);
        acc.resize(heads * head_dim);
        // The item this thread takes next, whose first chunks are asked for while this one ends.
        const int64_t next = k + slots < items ? order[k + slots] : -1;
        const RowStream<T> stream{k_data + h0 * head_dim,
                                  v_data + h0 * head_dim,
                                  table,
                                  len,
                                  next < 0 || next % chunks != c ? nullptr : tables + (next / chunks) * table_stride,
                                  next < 0 ? 0 : lens[next / chunks],
                                  block_size,
                                  slot_stride,
                                  (h1 - h0) * head_dim * static_cast<int64_t>(sizeof(T))};
        fast(q_data + b * q_stride + h0 * group * head_dim, fscale, h1 - h0, stream, scores.data(), top.data(),
             acc.data(), out_data + b * out_stride + h0 * group * head_dim);
        continue;
      }
#endif
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
      for (int64_t qh = 0; qh < heads; ++qh) softmax_general(scores.data() + qh * len, len, top[qh]);
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

}  // namespace

namespace turnout_cpu {

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

}  // namespace turnout_cpu

void register_paged_decode(pybind11::module& m) {
  m.def("paged_decode", &turnout_cpu::paged_decode, kReleaseGil, "paged decode attention over the cache in place (CPU)");
}
