// y = x @ weight.T in bfloat16 with AVX-512 BF16's pair dot product (vdpbf16ps), for the
// few-to-tens of rows of a decode step.
//
// The weight is packed once (`pack_bf16_linear`) so that one 64-byte vector holds two adjacent
// input columns of 16 consecutive outputs: packed[block][pair][lane][t] = weight[16 * block +
// lane][2 * pair + t], a block being 16 outputs (the last one zero-padded). The inner step then
// broadcasts one (x[m][2p], x[m][2p+1]) pair from memory and multiplies it with the pair-p
// vectors of kBlocks blocks: every lane of an accumulator is one output, so no horizontal sum is
// needed, and each instruction does 32 multiply-adds against the 16 of a float32 FMA.
// oneDNN uses the same instruction; on this project's 2-core machine this kernel takes 0.3-0.9x
// its time from 1 to 64 rows and ties it at 256 (docs/benchmarks.md), so a bfloat16 model on
// such a CPU multiplies through it alone.
//
// Products of two bfloat16 values are exact in float32 and accumulate in float32, like
// oneDNN's; only the order of the sums differs. Outputs round to nearest even (vcvtneps2bf16).
//
// Shapes: x (M, in) bfloat16, contiguous rows, `in` even; packed (blocks, in / 2, 16, 2)
// bfloat16; bias (out,) bfloat16 or none; y (M, out) bfloat16.

#include <torch/extension.h>

#include "common.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace {

constexpr int64_t kLanes = 16;  // outputs per block: one float32 vector of accumulators

#ifdef __AVX512BF16__
constexpr bool kHasBf16Dot = true;
constexpr int64_t kBlocks = 3;  // output blocks per tile: 48 outputs
constexpr int64_t kRows = 8;    // rows of x per tile: 24 accumulators of the 32 registers
constexpr int64_t kPanelRows = 256;  // rows per pass over the weight (256 x 4096 bf16 = 2 MiB)

// One tile: rows [0, R) of x (R <= kRows) times blocks [0, B) (B <= kBlocks) of the packed
// weight, whose pairs lie `pairs` vectors apart per block.
template <int64_t R, int64_t B>
inline void tile(const c10::BFloat16* x, int64_t x_stride, const c10::BFloat16* w, int64_t pairs,
                 const c10::BFloat16* bias, c10::BFloat16* y, int64_t y_stride, int64_t out_left) {
  __m512 acc[R][B];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  const int32_t* xp = reinterpret_cast<const int32_t*>(x);  // pairs of bfloat16
  const int64_t x_pairs = x_stride / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[B];
    for (int64_t b = 0; b < B; ++b) {
      wv[b] = (__m512bh)_mm512_loadu_si512(w + (b * pairs + p) * 2 * kLanes);
    }
    for (int64_t r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(xp[r * x_pairs + p]);
      for (int64_t b = 0; b < B; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t width = std::min<int64_t>(kLanes, out_left - b * kLanes);
    if (width <= 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
    __m512 bias_v = _mm512_setzero_ps();
    if (bias != nullptr) {
      const __m256i raw = _mm256_maskz_loadu_epi16(mask, bias + b * kLanes);
      bias_v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    }
    for (int64_t r = 0; r < R; ++r) {
      const __m256bh out = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][b], bias_v));
      _mm256_mask_storeu_epi16(y + r * y_stride + b * kLanes, mask, (__m256i)out);
    }
  }
}

template <int64_t B>
void rows_of_tile(int64_t rows, const c10::BFloat16* x, int64_t in, const c10::BFloat16* w, int64_t pairs,
                  const c10::BFloat16* bias, c10::BFloat16* y, int64_t out, int64_t out_left) {
  int64_t m = 0;
  for (; m + kRows <= rows; m += kRows) tile<kRows, B>(x + m * in, in, w, pairs, bias, y + m * out, out, out_left);
  const int64_t r = rows - m;
  x += m * in;
  y += m * out;
  switch (r) {
    case 0: return;
    case 1: return tile<1, B>(x, in, w, pairs, bias, y, out, out_left);
    case 2: return tile<2, B>(x, in, w, pairs, bias, y, out, out_left);
    case 3: return tile<3, B>(x, in, w, pairs, bias, y, out, out_left);
    case 4: return tile<4, B>(x, in, w, pairs, bias, y, out, out_left);
    case 5: return tile<5, B>(x, in, w, pairs, bias, y, out, out_left);
    case 6: return tile<6, B>(x, in, w, pairs, bias, y, out, out_left);
    default: return tile<7, B>(x, in, w, pairs, bias, y, out, out_left);
  }
}
#else
constexpr bool kHasBf16Dot = false;
#endif

int64_t blocks_of(int64_t out) { return (out + kLanes - 1) / kLanes; }

// weight (out, in) bfloat16 -> packed (blocks, in / 2, 16, 2), zero rows past `out`.
torch::Tensor pack_bf16_linear(const torch::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16, "weight must be (out, in) bfloat16");
  TORCH_CHECK(weight.size(1) % 2 == 0, "bf16_linear needs an even input width, got ", weight.size(1));
  const int64_t out = weight.size(0), in = weight.size(1), blocks = blocks_of(out);
  auto padded = torch::zeros({blocks * kLanes, in}, weight.options());
  padded.narrow(0, 0, out).copy_(weight);
  // (blocks, 16, in/2, 2) -> (blocks, in/2, 16, 2)
  return padded.view({blocks, kLanes, in / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

torch::Tensor bf16_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(kHasBf16Dot, "bf16_linear needs a CPU with AVX-512 BF16 (built without it here)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16, "x must be (M, in) bfloat16");
  TORCH_CHECK(packed.dim() == 4 && packed.size(2) == kLanes && packed.size(3) == 2 && packed.is_contiguous(),
              "packed must come from pack_bf16_linear");
  const int64_t rows = x.size(0), in = x.size(1), pairs = packed.size(1), blocks = packed.size(0);
  TORCH_CHECK(in == 2 * pairs, "x has ", in, " columns, the packed weight ", 2 * pairs);
  TORCH_CHECK(blocks == blocks_of(out), "out=", out, " does not match the packed weight's ", blocks, " blocks");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) TORCH_CHECK(bias->numel() == out && bias->scalar_type() == torch::kBFloat16, "bias (out,) bfloat16");
  auto y = torch::empty({rows, out}, x.options());
#ifdef __AVX512BF16__
  if (rows == 0) return y;
  const auto xc = x.contiguous();
  const auto b = has_bias ? bias->contiguous() : torch::Tensor();
  const auto* xd = xc.data_ptr<c10::BFloat16>();
  const auto* wd = packed.data_ptr<c10::BFloat16>();
  const auto* bd = has_bias ? b.data_ptr<c10::BFloat16>() : nullptr;
  auto* yd = y.data_ptr<c10::BFloat16>();
  const int64_t tiles = (blocks + kBlocks - 1) / kBlocks;
  // Panels of rows, so the rows a tile sweeps stay in cache for a long prefill chunk; within a
  // panel the threads split the outputs and each streams its share of the weight once.
  for (int64_t first_row = 0; first_row < rows; first_row += kPanelRows) {
    const int64_t panel = std::min(kPanelRows, rows - first_row);
    const auto* xs = xd + first_row * in;
    auto* ys = yd + first_row * out;
    at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t block = t * kBlocks, first = block * kLanes, left = out - first;
        const auto* w = wd + block * pairs * 2 * kLanes;
        const auto* bt = bd != nullptr ? bd + first : nullptr;
        switch (std::min(kBlocks, blocks - block)) {
          case 1: rows_of_tile<1>(panel, xs, in, w, pairs, bt, ys + first, out, left); break;
          case 2: rows_of_tile<2>(panel, xs, in, w, pairs, bt, ys + first, out, left); break;
          default: rows_of_tile<3>(panel, xs, in, w, pairs, bt, ys + first, out, left); break;
        }
      }
    });
  }
#endif
  return y;
}

}  // namespace

void register_bf16_linear(pybind11::module& m) {
  m.def("pack_bf16_linear", &pack_bf16_linear, kReleaseGil,
        "weight (out, in) bfloat16 -> the layout bf16_linear reads", pybind11::arg("weight"));
  m.def("bf16_linear", &bf16_linear, kReleaseGil, "x @ weight.T, bfloat16, weight from pack_bf16_linear (CPU)",
        pybind11::arg("x"), pybind11::arg("packed"), pybind11::arg("out"), pybind11::arg("bias") = pybind11::none());
  m.attr("HAS_BF16_DOT") = kHasBf16Dot;
}
