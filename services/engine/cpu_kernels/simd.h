// SIMD helpers the CPU kernels share (AVX-512, and AVX2 where a CPU has no AVX-512): rows of the
// cache's dtype widened to float32 lanes, narrowed back with rounding, and a vectorised exp for
// softmax.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// The kernels' 8-lane paths: a CPU with AVX2 and FMA but no AVX-512 (where it has AVX-512, its
// 16-lane paths run instead).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define TURNOUT_SIMD_AVX2 1
#endif

namespace turnout_simd {

// Asks for the `bytes` from p, line by line, into L2 (prefetcht1) ahead of their use. An asm
// statement because GCC 12 left the equivalent _mm_prefetch loop out of paged_decode's object
// code (no prefetch instruction in its disassembly), which an asm volatile cannot be.
inline void prefetch_l2(const void* p, int64_t bytes) {
  const char* line = static_cast<const char*>(p);
  for (int64_t offset = 0; offset < bytes; offset += 64) asm volatile("prefetcht1 %0" : : "m"(line[offset]));
}

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
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Cephes' expf, shared by exp16 and exp8: x = n ln2 + r with ln2 split in two for precision, and
// e^r ~ 1 + r + r^2 P(r), P's coefficients highest first.
constexpr float kExpLog2e = 1.44269504088896341f, kExpLn2Hi = 0.693359375f, kExpLn2Lo = -2.12194440e-4f;
constexpr float kExpFloor = -87.3f;  // e^-87.3 is still a normal float
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  // A bfloat16 is a float32's top 16 bits.
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// x rounded to T's precision and widened back (what static_cast<T> then float does, lane by lane):
// to nearest even, as static_cast<c10::BFloat16> does (inputs here are never NaN).
inline __m512 round16(__m512 x, float) { return x; }
inline __m512 round16(__m512 x, c10::BFloat16) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}
inline void store16(c10::BFloat16* p, __m512 v) {
  const __m512i top = _mm512_srli_epi32(_mm512_castps_si512(round16(v, c10::BFloat16())), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(top));
}

// e^x to ~1 ulp: Cephes' expf polynomial on x - n ln2, times 2^n. Inputs below -87.3 give
// e^-87.3, not 0 (mask those lanes where 0 matters); above ~88.7 the result is +inf.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpFloor));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[1]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[2]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[3]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[4]));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[5]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
// 16 x 16 floats, in registers: lane k of r[i] moves to lane i of r[k].
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int64_t i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int64_t i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 4; ++k) {
      t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
    }
  for (int64_t k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
}
#endif

#ifdef TURNOUT_SIMD_AVX2
// 8-lane helpers for CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2 and 3, many Intel client
// parts): the attention kernels' general paths and silu_mul use them.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) {
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline float sum8(__m256 v) {
  const __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 y = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// As round16, on 8 lanes.
inline __m256 round8(__m256 x, float) { return x; }
inline __m256 round8(__m256 x, c10::BFloat16) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff)));
  return _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}
inline void store8(c10::BFloat16* p, __m256 v) {
  // packus narrows within each 128-bit half; the permute brings the halves' four results together.
  const __m256i top = _mm256_srli_epi32(_mm256_castps_si256(round8(v, c10::BFloat16())), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
// e^x to ~1 ulp, as exp16: Cephes' polynomial on x - n ln2, times 2^n built in exponent bits.
// x is clamped to [-87.3, 89]: n in [-126, 129], applied as two factors 2^(n/2) and 2^(n - n/2),
// each a normal float, so e^x overflows to +inf past ~88.72 as expf does (silu's exp(-g) for a
// very negative gate) instead of wrapping the exponent field.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpFloor)), _mm256_set1_ps(89.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[1]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[2]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[3]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[4]));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[5]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i whole = _mm256_cvtps_epi32(n);
  const __m256i low = _mm256_srai_epi32(whole, 1), high = _mm256_sub_epi32(whole, low);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 low_scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(low, bias), 23));
  const __m256 high_scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(high, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, low_scale), high_scale);
}
#endif

}  // namespace turnout_simd
