// Paged attention for steps that carry prompt chunks: every new token of a sequence attends,
// causally, over its cached prefix and its own chunk, read in place from the paged cache.
//
// Shapes (see services/engine/attention/context.py):
//   q                (T, Hq, D)             the step's new tokens, sequence after sequence (rows may be strided)
//   k/v_cache        (N, block_size, Hkv, D) contiguous
//   block_tables     (B, max_blocks) int64, seq_lens (B,) int64 (this step's tokens included)
//   query_start_loc  (B+1,) int64: sequence b's tokens are rows query_start_loc[b] .. [b+1]-1,
//                    at positions seq_lens[b] - q_b .. seq_lens[b] - 1
//   out              (T, Hq, D)
//
// paged_decode treats each token as its own query (one matrix-vector product per token and
// head, a horizontal sum per score): 95-105 GFLOP/s on this project's 2-core machine for a
// step of 12 chunks of 128 tokens over 512 cached ones, 40% of such a step. Here a tile is 16
// query vectors of one KV head (the G query heads of consecutive tokens), one per AVX-512 lane,
// so each key and value element is widened once for 16 queries and every FMA is a full vector:
//   scores  s[j]  (16 lanes = the tile's queries) = sum_d qt[d] * k[j][d]   for 16 keys j
//   online softmax over the keys, per lane (running max m, running sum l)
//   output  ot[d] (16 lanes) = ot[d] * e^(m_old - m_new) + sum_j p[j] * v[j][d]
// with queries and outputs held transposed (qt, ot: D x 16). Scores, softmax and sums are
// float32 whatever the cache dtype. Without AVX-512, or for another head_dim, every token runs
// through paged_decode.

#include <torch/extension.h>

#include "common.h"
#include "ops.h"
#include "simd.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

#ifdef __AVX512F__
using turnout_simd::exp16;
using turnout_simd::load16;
using turnout_simd::store16;
using turnout_simd::to_float;
using turnout_simd::transpose16;

constexpr int64_t kLanes = 16;  // queries per tile, and keys per chunk

struct Rows {
  const int64_t* table;  // the sequence's block table
  int64_t context;       // positions cached before this step's first token of the sequence
  int64_t first;         // the tile's first query vector: token first / G, head first % G
  int64_t count;         // query vectors in the tile (<= kLanes)
};

// One tile of up to 16 query vectors of KV head h. q/out point at the sequence's first row.
template <typename T, int64_t D>
void attend_tile(const T* q, int64_t q_stride, T* out, int64_t out_stride, const T* k_head, const T* v_head,
                 int64_t group, int64_t head, const Rows& rows, int64_t block_size, int64_t slot_stride,
                 float scale) {
  alignas(64) float qt[D][kLanes];
  alignas(64) float ot[D][kLanes];
  alignas(64) float kf[kLanes][D];
  alignas(64) float vf[kLanes][D];
  alignas(64) int32_t position[kLanes];
  const T* query[kLanes];
  for (int64_t r = 0; r < kLanes; ++r) {
    // Lanes past the tile's queries repeat its last one: their results are never stored.
    const int64_t m = rows.first + std::min(r, rows.count - 1);
    const int64_t token = m / group, g = m % group;
    position[r] = static_cast<int32_t>(rows.context + token);
    query[r] = q + token * q_stride + (head * group + g) * D;
  }
  const __m512 scaled = _mm512_set1_ps(scale);
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    __m512 block[kLanes];
    for (int64_t r = 0; r < kLanes; ++r) block[r] = _mm512_mul_ps(load16(query[r] + d0), scaled);
    transpose16(block);
    for (int64_t d = 0; d < kLanes; ++d) _mm512_store_ps(qt[d0 + d], block[d]);
  }
  std::fill(&ot[0][0], &ot[0][0] + D * kLanes, 0.f);
  const __m512i positions = _mm512_load_si512(position);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 top = minus_inf, total = _mm512_setzero_ps();
  const int64_t keys = position[kLanes - 1] + 1;  // the last lane has the tile's last position
  for (int64_t c0 = 0; c0 < keys; c0 += kLanes) {
    const int64_t n = std::min(kLanes, keys - c0);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = c0 + j;
      const int64_t slot = (rows.table[p / block_size] * block_size + p % block_size) * slot_stride;
      to_float(k_head + slot, kf[j], D);
      to_float(v_head + slot, vf[j], D);
    }
    // Past the last key: weights are 0 there, so the values only need to be finite.
    for (int64_t j = n; j < kLanes; ++j) std::fill(vf[j], vf[j] + D, 0.f);
    __m512 s[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) s[j] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      const __m512 qd = _mm512_load_ps(qt[d]);
      for (int64_t j = 0; j < kLanes; ++j) s[j] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kf[j][d]), s[j]);
    }
    // Key c0 + j is visible to a lane whose position is >= it; masked scores weigh exactly 0.
    __mmask16 visible[kLanes];
    __m512 chunk_top = minus_inf;
    for (int64_t j = 0; j < kLanes; ++j) {
      visible[j] = j < n ? _mm512_cmpge_epi32_mask(positions, _mm512_set1_epi32(static_cast<int32_t>(c0 + j))) : 0;
      chunk_top = _mm512_mask_max_ps(chunk_top, visible[j], chunk_top, s[j]);
    }
    // Key 0 is visible to every lane, so after the first chunk `top` is finite in every lane.
    const __m512 new_top = _mm512_max_ps(top, chunk_top);
    const __m512 rescale = exp16(_mm512_sub_ps(top, new_top));  // ~0 on the first chunk, where ot and total are 0
    top = new_top;
    total = _mm512_mul_ps(total, rescale);
    for (int64_t j = 0; j < kLanes; ++j) {
      s[j] = _mm512_maskz_mov_ps(visible[j], exp16(_mm512_sub_ps(s[j], top)));
      total = _mm512_add_ps(total, s[j]);
    }
    // kDims output rows at a time: a single accumulator would chain 16 FMAs on their latency.
    constexpr int64_t kDims = 8;
    for (int64_t d = 0; d < D; d += kDims) {
      __m512 acc[kDims];
      for (int64_t u = 0; u < kDims; ++u) acc[u] = _mm512_mul_ps(_mm512_load_ps(ot[d + u]), rescale);
      for (int64_t j = 0; j < kLanes; ++j)
        for (int64_t u = 0; u < kDims; ++u) acc[u] = _mm512_fmadd_ps(s[j], _mm512_set1_ps(vf[j][d + u]), acc[u]);
      for (int64_t u = 0; u < kDims; ++u) _mm512_store_ps(ot[d + u], acc[u]);
    }
  }
  const __m512 inverse = _mm512_div_ps(_mm512_set1_ps(1.f), total);
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    __m512 block[kLanes];
    for (int64_t d = 0; d < kLanes; ++d) block[d] = _mm512_mul_ps(_mm512_load_ps(ot[d0 + d]), inverse);
    transpose16(block);  // block[r]: lane r's output, dimensions d0 .. d0 + 15
    for (int64_t r = 0; r < rows.count; ++r) {
      const int64_t m = rows.first + r;
      store16(out + (m / group) * out_stride + (head * group + m % group) * D + d0, block[r]);
    }
  }
}

#ifdef __AVX512BF16__
// The bfloat16 tile with bfloat16 dot products (vdpbf16ps: two products per float32 lane, summed
// in float32): keys are read from the cache as they are, pairs of dimensions at a time, and the
// softmax weights are rounded to bfloat16 for the value sum, as torch's CPU flash attention
// rounds them before its second matmul. The scale is applied to the scores, so queries stay exact.
//   qt[d/2]  lane r: (q[r][d], q[r][d+1])          keys: broadcast pair (k[j][d], k[j][d+1])
//   pw[j/2]  lane r: (p[r][j], p[r][j+1])          values: pairs (v[j][d], v[j+1][d]), interleaved per chunk
template <int64_t D>
void attend_tile_bf16(const c10::BFloat16* q, int64_t q_stride, c10::BFloat16* out, int64_t out_stride,
                      const c10::BFloat16* k_head, const c10::BFloat16* v_head, int64_t group, int64_t head,
                      const Rows& rows, int64_t block_size, int64_t slot_stride, float scale) {
  constexpr int64_t kPairs = D / 2;
  alignas(64) uint32_t qt[kPairs][kLanes];
  alignas(64) float ot[D][kLanes];
  alignas(64) uint32_t vp[kLanes / 2][D];  // vp[j/2][d] = (v[j][d], v[j+1][d]) of this chunk
  alignas(64) int32_t position[kLanes];
  const c10::BFloat16* query[kLanes];
  const c10::BFloat16* key[kLanes];
  for (int64_t r = 0; r < kLanes; ++r) {
    const int64_t m = rows.first + std::min(r, rows.count - 1);
    const int64_t token = m / group, g = m % group;
    position[r] = static_cast<int32_t>(rows.context + token);
    query[r] = q + token * q_stride + (head * group + g) * D;
  }
  for (int64_t w0 = 0; w0 < kPairs; w0 += kLanes) {  // 16 pairs = 32 dimensions per pass
    __m512 block[kLanes];
    for (int64_t r = 0; r < kLanes; ++r) block[r] = _mm512_loadu_ps(reinterpret_cast<const float*>(query[r] + 2 * w0));
    transpose16(block);  // moves 32-bit words: each a pair of bfloat16
    for (int64_t w = 0; w < kLanes; ++w) _mm512_store_ps(reinterpret_cast<float*>(qt[w0 + w]), block[w]);
  }
  std::fill(&ot[0][0], &ot[0][0] + D * kLanes, 0.f);
  // Interleaves two value rows' bfloat16: out[2i] = a[i], out[2i+1] = b[i], 32 of each per call pair.
  alignas(64) static const uint16_t kInterleaveLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                         8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t kInterleaveHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                         24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_index = _mm512_load_si512(kInterleaveLo), hi_index = _mm512_load_si512(kInterleaveHi);
  const __m512i positions = _mm512_load_si512(position);
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 scaled = _mm512_set1_ps(scale);
  __m512 top = minus_inf, total = _mm512_setzero_ps();
  const int64_t keys = position[kLanes - 1] + 1;
  for (int64_t c0 = 0; c0 < keys; c0 += kLanes) {
    const int64_t n = std::min(kLanes, keys - c0);
    const c10::BFloat16* value[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      // Past the last key a row repeats key c0: its weight is 0, so it only needs to be finite.
      const int64_t p = c0 + (j < n ? j : 0);
      const int64_t slot = (rows.table[p / block_size] * block_size + p % block_size) * slot_stride;
      key[j] = k_head + slot;
      value[j] = v_head + slot;
    }
    for (int64_t jp = 0; jp < kLanes / 2; ++jp) {
      for (int64_t d0 = 0; d0 < D; d0 += 32) {
        const __m512i a = _mm512_loadu_si512(value[2 * jp] + d0), b = _mm512_loadu_si512(value[2 * jp + 1] + d0);
        _mm512_store_si512(vp[jp] + d0, _mm512_permutex2var_epi16(a, lo_index, b));
        _mm512_store_si512(vp[jp] + d0 + 16, _mm512_permutex2var_epi16(a, hi_index, b));
      }
    }
    __m512 s[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) s[j] = _mm512_setzero_ps();
    for (int64_t w = 0; w < kPairs; ++w) {
      const __m512bh qw = (__m512bh)_mm512_load_si512(qt[w]);
      for (int64_t j = 0; j < kLanes; ++j) {
        const uint32_t pair = reinterpret_cast<const uint32_t*>(key[j])[w];
        s[j] = _mm512_dpbf16_ps(s[j], qw, (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pair)));
      }
    }
    __mmask16 visible[kLanes];
    __m512 chunk_top = minus_inf;
    for (int64_t j = 0; j < kLanes; ++j) {
      s[j] = _mm512_mul_ps(s[j], scaled);
      visible[j] = j < n ? _mm512_cmpge_epi32_mask(positions, _mm512_set1_epi32(static_cast<int32_t>(c0 + j))) : 0;
      chunk_top = _mm512_mask_max_ps(chunk_top, visible[j], chunk_top, s[j]);
    }
    const __m512 new_top = _mm512_max_ps(top, chunk_top);
    const __m512 rescale = exp16(_mm512_sub_ps(top, new_top));
    top = new_top;
    total = _mm512_mul_ps(total, rescale);
    __m512bh weights[kLanes / 2];
    for (int64_t jp = 0; jp < kLanes / 2; ++jp) {
      const __m512 p0 = _mm512_maskz_mov_ps(visible[2 * jp], exp16(_mm512_sub_ps(s[2 * jp], top)));
      const __m512 p1 = _mm512_maskz_mov_ps(visible[2 * jp + 1], exp16(_mm512_sub_ps(s[2 * jp + 1], top)));
      total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
      // Lane r: (p0[r], p1[r]) as bfloat16, rounded to nearest even.
      const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p0));
      const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p1));
      weights[jp] = (__m512bh)_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
    }
    constexpr int64_t kDims = 8;
    for (int64_t d = 0; d < D; d += kDims) {
      __m512 acc[kDims];
      for (int64_t u = 0; u < kDims; ++u) acc[u] = _mm512_mul_ps(_mm512_load_ps(ot[d + u]), rescale);
      for (int64_t jp = 0; jp < kLanes / 2; ++jp)
        for (int64_t u = 0; u < kDims; ++u)
          acc[u] = _mm512_dpbf16_ps(acc[u], weights[jp], (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(vp[jp][d + u])));
      for (int64_t u = 0; u < kDims; ++u) _mm512_store_ps(ot[d + u], acc[u]);
    }
  }
  const __m512 inverse = _mm512_div_ps(_mm512_set1_ps(1.f), total);
  for (int64_t d0 = 0; d0 < D; d0 += kLanes) {
    __m512 block[kLanes];
    for (int64_t d = 0; d < kLanes; ++d) block[d] = _mm512_mul_ps(_mm512_load_ps(ot[d0 + d]), inverse);
    transpose16(block);
    for (int64_t r = 0; r < rows.count; ++r) {
      const int64_t m = rows.first + r;
      store16(out + (m / group) * out_stride + (head * group + m % group) * D + d0, block[r]);
    }
  }
}
#endif

template <typename T>
using TileFn = void (*)(const T*, int64_t, T*, int64_t, const T*, const T*, int64_t, int64_t, const Rows&, int64_t,
                        int64_t, float);

template <typename T>
TileFn<T> tile_kernel(int64_t head_dim) {
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (head_dim == 64) return attend_tile_bf16<64>;
    if (head_dim == 128) return attend_tile_bf16<128>;
  }
#endif
  if (head_dim == 64) return attend_tile<T, 64>;
  if (head_dim == 128) return attend_tile<T, 128>;
  return nullptr;
}

template <typename T>
void prefill(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
             const torch::Tensor& block_tables, const torch::Tensor& seq_lens, const torch::Tensor& query_start_loc,
             double scale, TileFn<T> tile, torch::Tensor& out) {
  const int64_t num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  const int64_t group = num_heads / num_kv_heads, batch = seq_lens.size(0);
  const int64_t slot_stride = num_kv_heads * head_dim;
  const int64_t* starts = query_start_loc.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  // A work item is one tile of one KV head of one sequence; its cost grows with its last position.
  struct Item {
    int64_t sequence, head, first, count, cost;
  };
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    if (starts[b + 1] - starts[b] == 1) continue;  // a decoding sequence: paged_decode's
    const int64_t vectors = (starts[b + 1] - starts[b]) * group;
    const int64_t context = lens[b] - (starts[b + 1] - starts[b]);
    for (int64_t first = 0; first < vectors; first += kLanes) {
      const int64_t count = std::min(kLanes, vectors - first);
      const int64_t cost = context + (first + count - 1) / group + 1;
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({b, h, first, count, cost});
    }
  }
  // Longest first, dealt round-robin to the threads (as paged_decode deals its sequences).
  std::stable_sort(items.begin(), items.end(), [](const Item& x, const Item& y) { return x.cost > y.cost; });
  const int64_t total = static_cast<int64_t>(items.size());
  const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), total));
  const T* q_data = q.data_ptr<T>();
  const T* k_data = k_cache.data_ptr<T>();
  const T* v_data = v_cache.data_ptr<T>();
  T* out_data = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0), out_stride = out.stride(0), table_stride = block_tables.stride(0);
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, slots, 1, [&](int64_t first_slot, int64_t end_slot) {
    for (int64_t slot = first_slot; slot < end_slot; ++slot) {
      for (int64_t i = slot; i < total; i += slots) {
        const Item& item = items[i];
        const int64_t b = item.sequence;
        const int64_t context = lens[b] - (starts[b + 1] - starts[b]);
        const Rows rows{tables + b * table_stride, context, item.first, item.count};
        tile(q_data + starts[b] * q_stride, q_stride, out_data + starts[b] * out_stride, out_stride,
             k_data + item.head * head_dim, v_data + item.head * head_dim, group, item.head, rows, block_size,
             slot_stride, fscale);
      }
    }
  });
}
#endif

// Each token as its own query of paged_decode: its sequence's table, and its position + 1 as length.
torch::Tensor prefill_by_rows(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                              const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                              const torch::Tensor& query_start_loc, double scale) {
  const torch::Tensor counts = query_start_loc.narrow(0, 1, seq_lens.size(0)) - query_start_loc.narrow(0, 0, seq_lens.size(0));
  const torch::Tensor tables = block_tables.repeat_interleave(counts, 0).contiguous();
  const torch::Tensor row_seq_lens = seq_lens.repeat_interleave(counts, 0);
  const torch::Tensor row_starts = query_start_loc.narrow(0, 1, seq_lens.size(0)).repeat_interleave(counts, 0);
  // Row t of a sequence ending at row `end` with length L sits at position L - (end - t).
  const torch::Tensor rows = torch::arange(q.size(0), seq_lens.options());
  const torch::Tensor lens = (row_seq_lens - (row_starts - rows) + 1).contiguous();
  return turnout_cpu::paged_decode(q, k_cache, v_cache, tables, lens, scale);
}

}  // namespace

namespace turnout_cpu {

torch::Tensor paged_prefill(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                            const torch::Tensor& query_start_loc, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "q must be (T, Hq, D) with dense rows");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "K and V caches differ in shape");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0, "head shapes do not match");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt64 && seq_lens.scalar_type() == torch::kInt64 &&
                  query_start_loc.scalar_type() == torch::kInt64,
              "block_tables, seq_lens and query_start_loc must be int64");
  TORCH_CHECK(block_tables.stride(1) == 1 && seq_lens.is_contiguous() && query_start_loc.is_contiguous(),
              "block_tables rows, seq_lens and query_start_loc must be dense");
  TORCH_CHECK(block_tables.size(0) == seq_lens.size(0) && query_start_loc.size(0) == seq_lens.size(0) + 1,
              "one table and length per sequence, and one more query start");
  TORCH_CHECK(query_start_loc[seq_lens.size(0)].item<int64_t>() == q.size(0), "query_start_loc must end at T");
#ifdef __AVX512F__
  const bool tiled = q.scalar_type() == torch::kFloat32 ? tile_kernel<float>(q.size(2)) != nullptr
                     : q.scalar_type() == torch::kBFloat16 ? tile_kernel<c10::BFloat16>(q.size(2)) != nullptr
                                                           : false;
  if (tiled) {
    auto out = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());
    // Decoding sequences (one new token) of a mixed step fill only G of a tile's 16 lanes; paged_decode
    // does them in 0.3-0.45x the time (docs/benchmarks.md), so they go there and the tiles skip them.
    const torch::Tensor counts = query_start_loc.narrow(0, 1, seq_lens.size(0)) - query_start_loc.narrow(0, 0, seq_lens.size(0));
    const torch::Tensor decoding = (counts == 1).nonzero().flatten();
    if (decoding.numel() > 0) {
      const torch::Tensor rows = query_start_loc.index_select(0, decoding);
      const torch::Tensor attended =
          turnout_cpu::paged_decode(q.index_select(0, rows), k_cache, v_cache, block_tables.index_select(0, decoding),
                                    seq_lens.index_select(0, decoding), scale);
      out.index_copy_(0, rows, attended);
    }
    if (q.scalar_type() == torch::kFloat32) {
      prefill<float>(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, tile_kernel<float>(q.size(2)),
                     out);
    } else {
      prefill<c10::BFloat16>(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                             tile_kernel<c10::BFloat16>(q.size(2)), out);
    }
    return out;
  }
#endif
  return prefill_by_rows(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale);
}

}  // namespace turnout_cpu

void register_paged_prefill(pybind11::module& m) {
  m.def("paged_prefill", &turnout_cpu::paged_prefill, kReleaseGil,
        "causal paged attention for steps with prompt chunks, over the cache in place (CPU)");
}
