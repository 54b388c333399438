// y = x @ weight.T for a few rows of x (a decode step of 1-4 sequences) on the CPU.
//
// At such batch sizes a linear layer is a matrix-vector product bound by reading the weight
// once from memory; oneDNN's and MKL's GEMM reach ~10-18 GB/s there on this project's 2-core
// machine, about half what a plain streaming read gets. This kernel streams each weight row
// (contiguous, `in` elements) once, multiplies it with every row of x, and accumulates in
// float32; bfloat16 weights are widened to float32 in registers (a bfloat16 is a float32's top
// 16 bits), so the products are exact and only the sum order differs from a GEMM's.
//
// Shapes: x (M, in) float32 or bfloat16, contiguous rows; weight (out, in) same dtype,
// contiguous; bias (out,) or empty; y (M, out) in x's dtype.

#include <torch/extension.h>

#include "common.h"
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kMaxRows = 4;  // rows of x one pass over the weight serves

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
#endif

// One output element y[m][n] for every row m of x: the plain loop, for the last rows of a
// range and for CPUs without AVX-512.
template <typename T, int64_t M>
inline void one_output(const float* x, const T* w, float bias, T* y, int64_t in, int64_t y_stride, int64_t n) {
  float sums[M];
  int64_t i = 0;
#ifdef __AVX512F__
  __m512 acc[M];
  for (int64_t m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (; i + 16 <= in; i += 16) {
    const __m512 wv = load16(w + i);
    for (int64_t m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * in + i), wv, acc[m]);
  }
  for (int64_t m = 0; m < M; ++m) sums[m] = _mm512_reduce_add_ps(acc[m]);
#else
  for (int64_t m = 0; m < M; ++m) sums[m] = 0.f;
#endif
  for (; i < in; ++i) {
    const float wi = static_cast<float>(w[i]);
    for (int64_t m = 0; m < M; ++m) sums[m] += x[m * in + i] * wi;
  }
  for (int64_t m = 0; m < M; ++m) y[m * y_stride + n] = static_cast<T>(sums[m] + bias);
}

template <typename T, int64_t M>
void rows_kernel(const float* x, const T* weight, const T* bias, T* y, int64_t in, int64_t out, int64_t y_stride) {
  // Four weight rows at a time: 4*M independent FMA chains keep the FMA units and the memory
  // system busy (one chain waits on its own latency), and each x load serves four rows.
  constexpr int64_t kRows = 4;
  at::parallel_for(0, (out + kRows - 1) / kRows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t group = begin; group < end; ++group) {
      const int64_t first = group * kRows;
#ifdef __AVX512F__
      if (first + kRows <= out && in % 16 == 0) {
        __m512 acc[kRows][M];
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
        const T* w = weight + first * in;
        for (int64_t i = 0; i < in; i += 16) {
          __m512 xs[M];
          for (int64_t m = 0; m < M; ++m) xs[m] = _mm512_loadu_ps(x + m * in + i);
          for (int64_t r = 0; r < kRows; ++r) {
            const __m512 wv = load16(w + r * in + i);
            for (int64_t m = 0; m < M; ++m) acc[r][m] = _mm512_fmadd_ps(xs[m], wv, acc[r][m]);
          }
        }
        for (int64_t r = 0; r < kRows; ++r) {
          const float b = bias != nullptr ? static_cast<float>(bias[first + r]) : 0.f;
          for (int64_t m = 0; m < M; ++m) {
            y[m * y_stride + first + r] = static_cast<T>(_mm512_reduce_add_ps(acc[r][m]) + b);
          }
        }
        continue;
      }
#endif
      for (int64_t n = first; n < std::min(first + kRows, out); ++n) {
        const float b = bias != nullptr ? static_cast<float>(bias[n]) : 0.f;
        one_output<T, M>(x, weight + n * in, b, y, in, y_stride, n);
      }
    }
  });
}

template <typename T>
void dispatch_rows(int64_t rows, const float* x, const T* w, const T* b, T* y, int64_t in, int64_t out) {
  switch (rows) {
    case 1: return rows_kernel<T, 1>(x, w, b, y, in, out, out);
    case 2: return rows_kernel<T, 2>(x, w, b, y, in, out, out);
    case 3: return rows_kernel<T, 3>(x, w, b, y, in, out, out);
    default: return rows_kernel<T, 4>(x, w, b, y, in, out, out);
  }
}

torch::Tensor small_batch_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                 const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "x (M, in) and weight (out, in)");
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "x and weight must share a dtype");
  TORCH_CHECK(x.size(0) <= kMaxRows, "small_batch_linear takes at most ", kMaxRows, " rows");
  const int64_t rows = x.size(0), in = x.size(1), out = weight.size(0);
  auto y = torch::empty({rows, out}, x.options());
  if (rows == 0) return y;
  // x widened to float32 once (a few KB), so the inner loop reads it with plain vector loads.
  const auto x32 = x.to(torch::kFloat32).contiguous();
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) TORCH_CHECK(bias->numel() == out && bias->scalar_type() == x.scalar_type(), "bias (out,) in x's dtype");
  if (x.scalar_type() == torch::kFloat32) {
    dispatch_rows<float>(rows, x32.data_ptr<float>(), weight.data_ptr<float>(),
                         has_bias ? bias->contiguous().data_ptr<float>() : nullptr, y.data_ptr<float>(), in, out);
  } else if (x.scalar_type() == torch::kBFloat16) {
    const auto b = has_bias ? bias->contiguous() : torch::Tensor();
    dispatch_rows<c10::BFloat16>(rows, x32.data_ptr<float>(), weight.data_ptr<c10::BFloat16>(),
                                 has_bias ? b.data_ptr<c10::BFloat16>() : nullptr, y.data_ptr<c10::BFloat16>(), in,
                                 out);
  } else {
    TORCH_CHECK(false, "small_batch_linear supports float32 and bfloat16, got ", x.scalar_type());
  }
  return y;
}

}  // namespace

void register_small_batch_linear(pybind11::module& m) {
  m.def("small_batch_linear", &small_batch_linear, kReleaseGil, "x @ weight.T for at most 4 rows of x (CPU)",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("bias") = pybind11::none());
  m.attr("SMALL_BATCH_MAX_ROWS") = kMaxRows;
}
