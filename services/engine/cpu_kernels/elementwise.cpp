// The elementwise steps of a decoder layer on the CPU, one call each instead of 5-8 torch ops:
// RMSNorm (with the residual add before it) and SiLU(gate) * up. At batch 1 a decode step runs
// ~750 small torch ops whose dispatch costs more than their arithmetic; these remove ~16 per layer.
//
//   rotary:        per head, halves x1, x2 of x and c = T(cos), s = T(sin) at the token's position:
//                  (T(T(x1*c) - T(x2*s)), T(T(x2*c) + T(x1*s)))            (rotate-half layout)
// Roundings follow the torch ops they replace (services/engine/models/layers.py), so a model's
// output moves only by the order of a float32 sum:
//   rms_norm:      y = weight * T(x32 * rsqrt(mean(x32^2) + eps)),  x32 = float(x)
//   add_rms_norm:  s = T(x + residual); y = rms_norm(s)                (returns y, s)
//   silu_mul:      y = T(T(silu(float(gate))) * up)     gate, up = halves of the last dim
// where T() rounds to the tensor dtype (a no-op for float32) and every product is computed in
// float32, as torch computes bfloat16 arithmetic.

#include <torch/extension.h>

#include "common.h"
#include "ops.h"
#include "simd.h"
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <type_traits>

namespace {

#ifdef __AVX512F__
using turnout_simd::exp16;
using turnout_simd::load16;
using turnout_simd::round16;
using turnout_simd::store16;
#elif defined(TURNOUT_SIMD_AVX2)
using turnout_simd::exp8;
using turnout_simd::load8;
using turnout_simd::round8;
using turnout_simd::store8;
#endif

// Elements of work below which a call runs on the calling thread alone: opening a parallel region
// and meeting at its barrier costs more than the arithmetic of a decode step's few rows (at 16
// rows, 6 regions a layer cost ~10% of a bfloat16 step, docs/benchmarks.md).
constexpr int64_t kSerialElements = 1 << 16;

// at::parallel_for's grain for items of `per_item` elements each: serial below kSerialElements.
inline int64_t grain_of(int64_t per_item) { return std::max<int64_t>(1, kSerialElements / std::max<int64_t>(1, per_item)); }

template <typename T>
inline float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T>
void norm_rows(const T* x, const T* weight, T* y, int64_t rows, int64_t dim, double eps) {
  at::parallel_for(0, rows, grain_of(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * dim;
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < dim; ++i) {
        const float v = static_cast<float>(row[i]);
        squares += v * v;
      }
      const float scale = 1.f / std::sqrt(squares / static_cast<float>(dim) + static_cast<float>(eps));
      T* out = y + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        out[i] = static_cast<T>(static_cast<float>(weight[i]) * round_to<T>(static_cast<float>(row[i]) * scale));
      }
    }
  });
}

template <typename T>
void add_rows(const T* x, const T* residual, T* summed, int64_t count) {
  at::parallel_for(0, count, grain_of(1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      summed[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(residual[i]));
    }
  });
}

template <typename T>
void silu_mul_rows(const T* gate_up, T* y, int64_t rows, int64_t half) {
  at::parallel_for(0, rows, grain_of(half), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = gate_up + r * 2 * half;
      const T* up = gate + half;
      T* out = y + r * half;
      int64_t i = 0;
#ifdef __AVX512F__
      // exp16 is Cephes' expf to ~1 ulp; torch's silu uses its own vectorised exp, so the two
      // may differ in float32's last bit (and round alike to bfloat16 but for rare ties).
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {  // (dispatch also makes double)
        const __m512 one = _mm512_set1_ps(1.f);
        for (; i + 16 <= half; i += 16) {
          const __m512 g = load16(gate + i);
          const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), g))));
          store16(out + i, _mm512_mul_ps(round16(silu, T()), load16(up + i)));
        }
      }
#elif defined(TURNOUT_SIMD_AVX2)
      // The same on 8 lanes; exp8 is the same polynomial, and overflows to +inf as expf does.
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
        const __m256 one = _mm256_set1_ps(1.f);
        for (; i + 8 <= half; i += 8) {
          const __m256 g = load8(gate + i);
          const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
          store8(out + i, _mm256_mul_ps(round8(silu, T()), load8(up + i)));
        }
      }
#endif
      for (; i < half; ++i) {
        const float g = static_cast<float>(gate[i]), u = static_cast<float>(up[i]);
        out[i] = static_cast<T>(round_to<T>(g / (1.f + std::exp(-g))) * u);
      }
    }
  });
}

template <typename T>
void rotate_rows(const T* x, T* y, const float* cos, const float* sin, int64_t tokens, int64_t heads, int64_t dim,
                 int64_t x_stride) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens * heads, grain_of(dim), [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads, h = item % heads;
      const T* in = x + t * x_stride + h * dim;
      T* out = y + (t * heads + h) * dim;
      const float* c_row = cos + t * half;
      const float* s_row = sin + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const float c = round_to<T>(c_row[i]), s = round_to<T>(s_row[i]);
        const float x1 = static_cast<float>(in[i]), x2 = static_cast<float>(in[half + i]);
        out[i] = static_cast<T>(round_to<T>(x1 * c) - round_to<T>(x2 * s));
        out[half + i] = static_cast<T>(round_to<T>(x2 * c) + round_to<T>(x1 * s));
      }
    }
  });
}

void check(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16, name,
              " must be float32 or bfloat16");
}

}  // namespace

namespace turnout_cpu {

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  check(x, "x");
  check(weight, "weight");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && x.size(-1) == weight.numel(), "weight (dim,) in x's dtype");
  auto y = torch::empty_like(x);
  const int64_t dim = weight.numel(), rows = x.numel() / dim;
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "rms_norm", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, dim, eps);
  });
  return y;
}

std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps) {
  check(x, "x");
  check(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(), "x and residual differ");
  auto summed = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "add_rms_norm", [&] {
    add_rows<scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), summed.data_ptr<scalar_t>(), x.numel());
  });
  return {rms_norm(summed, weight, eps), summed};
}

torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  check(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "gate_up's last dimension must be even (gate then up)");
  const int64_t half = gate_up.size(-1) / 2, rows = gate_up.numel() / gate_up.size(-1);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = half;
  auto y = torch::empty(sizes, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, gate_up.scalar_type(), "silu_mul", [&] {
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), rows, half);
  });
  return y;
}

torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  // x (T, H, D) whose heads are dense (rows may be strided: q, k are views of the QKV output).
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "x must be (T, H, D) with dense heads");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
                  sin.is_contiguous(),
              "cos and sin must be contiguous float32");
  TORCH_CHECK(x.size(2) % 2 == 0 && cos.numel() == x.size(0) * x.size(2) / 2 && sin.numel() == cos.numel(),
              "cos and sin must be (T, D/2)");
  auto y = torch::empty({x.size(0), x.size(1), x.size(2)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "rotary", [&] {
    rotate_rows<scalar_t>(x.data_ptr<scalar_t>(), y.data_ptr<scalar_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                          x.size(0), x.size(1), x.size(2), x.stride(0));
  });
  return y;
}

}  // namespace turnout_cpu

void register_elementwise(pybind11::module& m) {
  m.def("rms_norm", &turnout_cpu::rms_norm, kReleaseGil, "weight * T(x * rsqrt(mean(x^2) + eps)) (CPU)");
  m.def("add_rms_norm", &turnout_cpu::add_rms_norm, kReleaseGil, "(rms_norm(x + residual), x + residual) (CPU)");
  m.def("silu_mul", &turnout_cpu::silu_mul, kReleaseGil, "silu(gate) * up over the halves of the last dimension (CPU)");
  m.def("rotary", &turnout_cpu::rotary, kReleaseGil, "x (T, H, D) rotated by cos/sin (T, D/2), rotate-half layout (CPU)");
}
