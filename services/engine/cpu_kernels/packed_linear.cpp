// y = x @ weight.T on the CPU through a weight packed for register-tiled broadcast products,
// float32 (AVX-512) and bfloat16 (AVX-512 BF16, or AVX2 and FMA on a CPU without AVX-512), for
// the one to hundreds of rows of a step.
//
// The weight is packed once (`pack_linear`) so that one 64-byte vector holds `kStep` adjacent
// input columns of 16 consecutive outputs: packed[block][column / kStep][lane][t] =
// weight[16 * block + lane][kStep * (column / kStep) + t], a block being 16 outputs (the last
// one zero-padded). bfloat16 takes two columns per vector (kStep 2) and vdpbf16ps, which does
// 32 multiply-adds per instruction; float32 one column and a plain FMA. The inner step
// broadcasts x's kStep values of one row from memory and multiplies them with that step's
// vectors of kBlocks blocks: every accumulator lane is one output, so no horizontal sum is
// needed, and a tile keeps kRows x kBlocks accumulators in registers.
//
// On this project's 2-core machine the bfloat16 kernel takes 0.3-0.9x oneDNN's time from 1 to
// 64 rows and ties it at 256 (docs/benchmarks.md), so the engine sends every bfloat16 matmul
// here; float32 goes where it measured faster (services/engine/models/layers.py).
//
// Products of two bfloat16 values are exact in float32 and accumulate in float32, like
// oneDNN's; only the order of the sums differs. bfloat16 outputs round to nearest even.
//
// Shapes: x (M, in) contiguous rows; packed (blocks, in / kStep, 16, kStep) in x's dtype;
// bias (out,) in x's dtype or none; y (M, out) in x's dtype.

#include <torch/extension.h>

#include "common.h"
#include "ops.h"
#include "simd.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;  // outputs per block: one float32 vector of accumulators

#if defined(__AVX512BF16__) || defined(TURNOUT_SIMD_AVX2)
constexpr bool kHasBf16 = true;
#else
constexpr bool kHasBf16 = false;
#endif
#ifdef __AVX512F__
constexpr bool kHasF32 = true;
#else
constexpr bool kHasF32 = false;
#endif

template <typename T>
constexpr int64_t kStep = std::is_same_v<T, c10::BFloat16> ? 2 : 1;  // input columns per vector

int64_t blocks_of(int64_t out) { return (out + kLanes - 1) / kLanes; }

#ifdef __AVX512F__
constexpr int64_t kBlocks = 3;       // output blocks per tile: 48 outputs
constexpr int64_t kRows = 8;         // rows of x per tile: 24 accumulators of the 32 registers
constexpr int64_t kPanelRows = 256;  // rows per pass over the weight, so a tile's rows stay in cache

// x's kStep values at `x`, broadcast to every lane, and acc += that * w (w: one packed vector).
inline __m512i broadcast(const float* x) { return _mm512_castps_si512(_mm512_set1_ps(*x)); }
inline __m512 multiply_add(__m512 acc, __m512i x, __m512i w, const float*) {
  return _mm512_fmadd_ps(_mm512_castsi512_ps(x), _mm512_castsi512_ps(w), acc);
}

#ifdef __AVX512BF16__
inline __m512i broadcast(const c10::BFloat16* x) {
  int32_t pair;
  std::memcpy(&pair, x, sizeof(pair));
  return _mm512_set1_epi32(pair);
}
inline __m512 multiply_add(__m512 acc, __m512i x, __m512i w, const c10::BFloat16*) {
  return _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
}
#endif

inline __m512 load_bias(const float* bias, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, bias); }
inline __m512 load_bias(const c10::BFloat16* bias, __mmask16 mask) {
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, bias);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store(float* y, __m512 v, __mmask16 mask) { _mm512_mask_storeu_ps(y, mask, v); }
#ifdef __AVX512BF16__
inline void store(c10::BFloat16* y, __m512 v, __mmask16 mask) {
  _mm256_mask_storeu_epi16(y, mask, (__m256i)_mm512_cvtneps_pbh(v));
}
#endif

// One tile: rows [0, R) of x (R <= kRows) times blocks [0, B) (B <= kBlocks) of the packed
// weight, whose steps lie `steps` vectors apart per block.
template <typename T, int64_t R, int64_t B>
inline void tile(const T* x, int64_t in, const T* w, int64_t steps, const T* bias, T* y, int64_t out,
                 int64_t out_left) {
  constexpr int64_t step = kStep<T>;
  __m512 acc[R][B];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    __m512i wv[B];  // loaded once per step, used by every row
    for (int64_t b = 0; b < B; ++b) wv[b] = _mm512_loadu_si512(w + (b * steps + s) * step * kLanes);
    for (int64_t r = 0; r < R; ++r) {
      const __m512i xv = broadcast(x + r * in + s * step);
      for (int64_t b = 0; b < B; ++b) acc[r][b] = multiply_add(acc[r][b], xv, wv[b], x);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t width = std::min<int64_t>(kLanes, out_left - b * kLanes);
    if (width <= 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
    const __m512 bias_v = bias != nullptr ? load_bias(bias + b * kLanes, mask) : _mm512_setzero_ps();
    for (int64_t r = 0; r < R; ++r) store(y + r * out + b * kLanes, _mm512_add_ps(acc[r][b], bias_v), mask);
  }
}

template <typename T, int64_t B>
void rows_of_tile(int64_t rows, const T* x, int64_t in, const T* w, int64_t steps, const T* bias, T* y, int64_t out,
                  int64_t out_left) {
  int64_t m = 0;
  for (; m + kRows <= rows; m += kRows) tile<T, kRows, B>(x + m * in, in, w, steps, bias, y + m * out, out, out_left);
  x += m * in;
  y += m * out;
  switch (rows - m) {
    case 0: return;
    case 1: return tile<T, 1, B>(x, in, w, steps, bias, y, out, out_left);
    case 2: return tile<T, 2, B>(x, in, w, steps, bias, y, out, out_left);
    case 3: return tile<T, 3, B>(x, in, w, steps, bias, y, out, out_left);
    case 4: return tile<T, 4, B>(x, in, w, steps, bias, y, out, out_left);
    case 5: return tile<T, 5, B>(x, in, w, steps, bias, y, out, out_left);
    case 6: return tile<T, 6, B>(x, in, w, steps, bias, y, out, out_left);
    default: return tile<T, 7, B>(x, in, w, steps, bias, y, out, out_left);
  }
}

template <typename T>
void run(const T* x, const T* w, const T* bias, T* y, int64_t rows, int64_t in, int64_t out) {
  const int64_t blocks = blocks_of(out), steps = in / kStep<T>;
  const int64_t tiles = (blocks + kBlocks - 1) / kBlocks;
  for (int64_t first_row = 0; first_row < rows; first_row += kPanelRows) {
    const int64_t panel = std::min(kPanelRows, rows - first_row);
    const T* xs = x + first_row * in;
    T* ys = y + first_row * out;
    // Within a panel the threads split the outputs: each streams its share of the weight once.
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t block = t * kBlocks, first = block * kLanes, left = out - first;
        const T* wt = w + block * steps * kStep<T> * kLanes;
        const T* bt = bias != nullptr ? bias + first : nullptr;
        switch (std::min(kBlocks, blocks - block)) {
          case 1: rows_of_tile<T, 1>(panel, xs, in, wt, steps, bt, ys + first, out, left); break;
          case 2: rows_of_tile<T, 2>(panel, xs, in, wt, steps, bt, ys + first, out, left); break;
          default: rows_of_tile<T, 3>(panel, xs, in, wt, steps, bt, ys + first, out, left); break;
        }
      }
    });
  }
}
#endif

#ifdef TURNOUT_SIMD_AVX2
// bfloat16 without AVX-512 (AMD Zen 2 and 3, many Intel client parts): the same packed weight,
// each 64-byte vector of a block read as two halves of 8 outputs. A half's 32-bit lanes hold
// (column 2s, column 2s + 1) of one output, so a shift and a mask widen it to the two columns'
// float32 weights, and plain FMAs take them with x's two values, which a panel widens to float32
// once. Every weight is read once per panel, as on AVX-512, at half float32's bytes: decode at a
// few rows is bound by reading the weights. The products are exact in float32 as there; the sums
// are float32, in another order; outputs round to nearest even.
namespace widened {

constexpr int64_t kHalves = 2;       // 8-output halves of one 16-output block per tile
constexpr int64_t kRows = 4;         // rows per tile: 8 accumulators, 2 weights, 2 broadcasts (6 spilled)
constexpr int64_t kPanelRows = 128;  // rows per pass over the weight (their float32 copy: 128 x in)

template <int64_t R>
inline void tile(const float* x, int64_t in, const c10::BFloat16* w, int64_t steps, const c10::BFloat16* bias,
                 c10::BFloat16* y, int64_t out, int64_t out_left) {
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u));
  __m256 acc[R][kHalves];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t h = 0; h < kHalves; ++h) acc[r][h] = _mm256_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    const c10::BFloat16* ws = w + s * 2 * kLanes;
    for (int64_t h = 0; h < kHalves; ++h) {
      const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + h * 16));
      const __m256 even = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));  // column 2s
      const __m256 odd = _mm256_castsi256_ps(_mm256_and_si256(pairs, high));  // column 2s + 1
      for (int64_t r = 0; r < R; ++r) {
        const float* xr = x + r * in + 2 * s;
        acc[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr), even, acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr + 1), odd, acc[r][h]);
      }
    }
  }
  for (int64_t h = 0; h < kHalves; ++h) {
    const int64_t width = std::min<int64_t>(8, out_left - h * 8);
    if (width <= 0) break;
    float bias_v[8] = {};
    if (bias != nullptr) turnout_simd::to_float(bias + h * 8, bias_v, width);
    const __m256 b = _mm256_loadu_ps(bias_v);
    for (int64_t r = 0; r < R; ++r) {
      c10::BFloat16* yr = y + r * out + h * 8;
      const __m256 v = _mm256_add_ps(acc[r][h], b);
      if (width == 8) {
        turnout_simd::store8(yr, v);
      } else {  // the last block's tail: no 16-bit masked store in AVX2
        c10::BFloat16 part[8];
        turnout_simd::store8(part, v);
        std::copy(part, part + width, yr);
      }
    }
  }
}

void run(const c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* bias, c10::BFloat16* y, int64_t rows,
         int64_t in, int64_t out) {
  const int64_t blocks = blocks_of(out), steps = in / 2;
  std::vector<float> wide(static_cast<size_t>(std::min(kPanelRows, rows) * in));
  for (int64_t first_row = 0; first_row < rows; first_row += kPanelRows) {
    const int64_t panel = std::min(kPanelRows, rows - first_row);
    turnout_simd::to_float(x + first_row * in, wide.data(), panel * in);
    c10::BFloat16* ys = y + first_row * out;
    // Within a panel the threads split the blocks: each streams its share of the weight once.
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kLanes, left = out - first;
        const c10::BFloat16* wb = w + block * steps * 2 * kLanes;
        const c10::BFloat16* bb = bias != nullptr ? bias + first : nullptr;
        const float* xs = wide.data();
        c10::BFloat16* yb = ys + first;
        int64_t m = 0;
        for (; m + kRows <= panel; m += kRows) tile<kRows>(xs + m * in, in, wb, steps, bb, yb + m * out, out, left);
        switch (panel - m) {
          case 0: break;
          case 1: tile<1>(xs + m * in, in, wb, steps, bb, yb + m * out, out, left); break;
          case 2: tile<2>(xs + m * in, in, wb, steps, bb, yb + m * out, out, left); break;
          default: tile<3>(xs + m * in, in, wb, steps, bb, yb + m * out, out, left); break;
        }
      }
    });
  }
}

}  // namespace widened
#endif

bool supported(torch::ScalarType dtype) {
  return (dtype == torch::kBFloat16 && kHasBf16) || (dtype == torch::kFloat32 && kHasF32);
}

int64_t step_of(torch::ScalarType dtype) { return dtype == torch::kBFloat16 ? 2 : 1; }

}  // namespace

namespace turnout_cpu {

// weight (out, in) -> packed (blocks, in / step, 16, step), zero rows past `out`.
torch::Tensor pack_linear(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "weight must be (out, in)");
  TORCH_CHECK(supported(weight.scalar_type()), "packed_linear has no ", weight.scalar_type(),
              " kernel on this CPU (float32 needs AVX-512, bfloat16 AVX-512 BF16 or AVX2 without AVX-512)");
  const int64_t out = weight.size(0), in = weight.size(1), blocks = blocks_of(out);
  const int64_t step = step_of(weight.scalar_type());
  TORCH_CHECK(in % step == 0, "a bfloat16 packed_linear needs an even input width, got ", in);
  auto padded = torch::zeros({blocks * kLanes, in}, weight.options());
  padded.narrow(0, 0, out).copy_(weight);
  // (blocks, 16, in/step, step) -> (blocks, in/step, 16, step)
  return padded.view({blocks, kLanes, in / step, step}).permute({0, 2, 1, 3}).contiguous();
}

torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out,
                            const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2, "x must be (M, in)");
  TORCH_CHECK(x.scalar_type() == packed.scalar_type(), "x and the packed weight must share a dtype");
  TORCH_CHECK(supported(x.scalar_type()), "packed_linear has no ", x.scalar_type(), " kernel on this CPU");
  const int64_t step = step_of(x.scalar_type());
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kLanes && packed.size(3) == step && packed.is_contiguous(),
              "packed must come from pack_linear");
  const int64_t rows = x.size(0), in = x.size(1);
  TORCH_CHECK(in == packed.size(1) * step, "x has ", in, " columns, the packed weight ", packed.size(1) * step);
  TORCH_CHECK(packed.size(0) == blocks_of(out), "out=", out, " does not match the packed weight's ", packed.size(0),
              " blocks");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->numel() == out && bias->scalar_type() == x.scalar_type(), "bias must be (out,) in x's dtype");
  }
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
  const auto xc = x.contiguous();
  const auto b = has_bias ? bias->contiguous() : torch::Tensor();
#ifdef __AVX512F__
  if (x.scalar_type() == torch::kFloat32) {
    run<float>(xc.data_ptr<float>(), packed.data_ptr<float>(), has_bias ? b.data_ptr<float>() : nullptr,
               y.data_ptr<float>(), rows, in, out);
  }
#endif
#ifdef TURNOUT_SIMD_AVX2
  if (x.scalar_type() == torch::kBFloat16) {
    widened::run(xc.data_ptr<c10::BFloat16>(), packed.data_ptr<c10::BFloat16>(),
                 has_bias ? b.data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(), rows, in, out);
  }
#endif
#ifdef __AVX512BF16__
  if (x.scalar_type() == torch::kBFloat16) {
    run<c10::BFloat16>(xc.data_ptr<c10::BFloat16>(), packed.data_ptr<c10::BFloat16>(),
                       has_bias ? b.data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(), rows, in, out);
  }
#endif
  return y;
}

}  // namespace turnout_cpu

void register_packed_linear(pybind11::module& m) {
  m.def("pack_linear", &turnout_cpu::pack_linear, kReleaseGil, "weight (out, in) -> the layout packed_linear reads",
        pybind11::arg("weight"));
  m.def("packed_linear", &turnout_cpu::packed_linear, kReleaseGil, "x @ weight.T, weight from pack_linear (CPU)",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("out"), pybind11::arg("bias") = pybind11::none());
  // Names of the dtypes packed_linear takes on this CPU (the build is -march=native).
  pybind11::list dtypes;
  if (kHasF32) dtypes.append("float32");
  if (kHasBf16) dtypes.append("bfloat16");
  m.attr("PACKED_LINEAR_DTYPES") = dtypes;
}
