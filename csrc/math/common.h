// Shared definitions for host (C++) and device (CUDA) code: the FK_HD qualifier, storage types for
// 16-bit floats, and load/store helpers that widen every storage type to its compute type.
//
// Mixed-precision policy (as in apex's functors): float16 and bfloat16 are *storage* types only;
// every computation runs in float and is rounded once on store. float and double compute in
// themselves.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FK_HD __host__ __device__ __forceinline__
#else
#define FK_HD inline
#endif

namespace fk {

// dtype codes shared with Python (fedkernels/_backend.py keeps the same table).
enum DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

struct half_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

FK_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FK_HD uint64_t double_to_bits(double f) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(f));
#else
  uint64_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FK_HD double bits_to_double(uint64_t u) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

FK_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// IEEE half <-> float with round-to-nearest-even, branch-free, valid for every input including
// subnormals, infinities and NaN. Algorithm: M. Dukhan's FP16 library (fp16_ieee_*_value), which
// relies only on exactly-rounded float arithmetic (true for SSE and CUDA without fast-math).
FK_HD float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = bits_to_float((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = bits_to_float((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? float_to_bits(denormalized) : float_to_bits(normalized));
  return bits_to_float(result);
}

FK_HD uint16_t float_to_half(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  const uint32_t w = float_to_bits(f);
  const float abs_f = bits_to_float(w & 0x7FFFFFFFu);
  float base = (abs_f * scale_to_inf) * scale_to_zero;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

FK_HD float bfloat16_to_float(uint16_t b) { return bits_to_float(static_cast<uint32_t>(b) << 16); }

FK_HD uint16_t float_to_bfloat16(float f) {
  const uint32_t u = float_to_bits(f);
  // NaN keeps its sign and becomes the canonical quiet NaN (as torch does).
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(is_nan ? ((u >> 16) | 0x0040u) : rounded);
}

// Compute type of each storage type.
template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<half_t> {
  using type = float;
};
template <>
struct Acc<bfloat16_t> {
  using type = float;
};

FK_HD float load(const float* p, int64_t i) { return p[i]; }
FK_HD double load(const double* p, int64_t i) { return p[i]; }
FK_HD float load(const half_t* p, int64_t i) { return half_to_float(p[i].bits); }
FK_HD float load(const bfloat16_t* p, int64_t i) { return bfloat16_to_float(p[i].bits); }

FK_HD void store(float* p, int64_t i, float v) { p[i] = v; }
FK_HD void store(double* p, int64_t i, double v) { p[i] = v; }
FK_HD void store(half_t* p, int64_t i, float v) { p[i].bits = float_to_half(v); }
FK_HD void store(bfloat16_t* p, int64_t i, float v) { p[i].bits = float_to_bfloat16(v); }

}  // namespace fk
