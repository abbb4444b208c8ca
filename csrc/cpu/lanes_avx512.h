// Blocks of N 512-bit vectors (16 float32 lanes each) with the operations of
// csrc/math/prox.h's lane-generic formula (scad_small), for the AVX-512 variant's loops. Each
// operation is one instruction per vector with the scalar function's bits: the same IEEE operation
// (sub; fk_sub_m's x * 1 - c as one FMA; fma), the same integer max of bit patterns, and
// fk_max_cap_sign's min and sign as one vrangeps (AVX-512 DQ, which the variant requires). float32
// only: float64's scalar form takes float max (see prox.h, fk_max0), whose -0 under FTZ the range
// instruction would not keep.
//
// An operation runs on all N vectors before the next one starts, so the instructions of N
// independent chains sit side by side: the formula's chain is ~16 cycles deep, and with N = 8 the
// core finds ready work where one vector at a time left its pipes idle (AMD Zen 5, SCAD's two-term
// small step in cache: 2.36 against 2.45 us per 64 K float32 values).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fk {
namespace FK_CPU_ISA {

// The 512-bit instructions of one element type.
template <typename T>
struct Simd;
template <>
struct Simd<float> {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V splat(float c) { return _mm512_set1_ps(c); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V fmsub(V a, V b, V c) { return _mm512_fmsub_ps(a, b, c); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V imax(V a, V b) {
    return _mm512_castsi512_ps(_mm512_max_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
  static V magnitude(V v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
  }
  // imm 0x02: the operand of smaller magnitude, with the first one's sign
  static V range_absmin_sign(V v, V r) { return _mm512_range_ps(v, r, 0x02); }
};
template <typename T, int N>
struct Block {
  using S = Simd<T>;
  static constexpr int64_t kValues = int64_t(S::kLanes) * N;
  typename S::V x[N];
};

template <typename T, int N, class F>
inline Block<T, N> each(F&& f) {
  Block<T, N> out;
  for (int i = 0; i < N; ++i) out.x[i] = f(i);
  return out;
}
template <typename T, int N>
inline Block<T, N> splat_block(T c) {
  return each<T, N>([&](int) { return Simd<T>::splat(c); });
}
template <typename T, int N>
inline Block<T, N> load_block(const T* p) {
  return each<T, N>([&](int i) { return Simd<T>::load(p + Simd<T>::kLanes * i); });
}

template <typename T, int N>
inline Block<T, N> operator-(const Block<T, N>& a, const Block<T, N>& b) {
  return each<T, N>([&](int i) { return Simd<T>::sub(a.x[i], b.x[i]); });
}
template <typename T, int N>
inline Block<T, N> fk_sub_m(const Block<T, N>& a, const Block<T, N>& b, const Block<T, N>& one) {
  return each<T, N>([&](int i) { return Simd<T>::fmsub(a.x[i], one.x[i], b.x[i]); });
}
template <typename T, int N>
inline Block<T, N> fk_fma(const Block<T, N>& a, const Block<T, N>& b, const Block<T, N>& c) {
  return each<T, N>([&](int i) { return Simd<T>::fmadd(a.x[i], b.x[i], c.x[i]); });
}
template <typename T, int N>
inline Block<T, N> fk_imax(const Block<T, N>& a, const Block<T, N>& b) {
  return each<T, N>([&](int i) { return Simd<T>::imax(a.x[i], b.x[i]); });
}
template <typename T, int N>
inline Block<T, N> fk_max0(const Block<T, N>& x, const Block<T, N>& zero) {
  return fk_imax(x, zero);
}
template <typename T, int N>
inline const Block<T, N>& fk_cap_q(const Block<T, N>& q, const Block<T, N>& /*zero*/) {
  return q;
}
template <typename T, int N>
inline Block<T, N> fk_magnitude(const Block<T, N>& v) {
  return each<T, N>([&](int i) { return Simd<T>::magnitude(v.x[i]); });
}

// min(max(u0, mid), t) with v's sign: the range instruction returns the operand of smaller magnitude
// (|v| = t, or r = max(u0, mid) >= +0) with v's sign; a NaN v (r is then NaN too) gives v made
// quiet, which is the scalar's result there. The max is taken here; the range waits for the store
// (store_block below), which runs it vector by vector, each result stored as soon as it is computed.
// Stored after all N, the results left the compiler free to load v again from memory for the range
// instead of keeping it in a register: one more load a vector, 2.47 against 2.37 us per 64 K
// float32 values in cache (AMD Zen 5).
template <typename T, int N>
struct CappedBlock {
  Block<T, N> r, v;
};
template <typename T, int N>
inline CappedBlock<T, N> fk_max_cap_sign(const Block<T, N>& u0, const Block<T, N>& mid, const Block<T, N>& /*t*/,
                                         const Block<T, N>& v) {
  return {fk_imax(u0, mid), v};
}
template <typename T, int N>
inline void store_block(T* p, const CappedBlock<T, N>& c) {
  for (int i = 0; i < N; ++i) Simd<T>::store(p + Simd<T>::kLanes * i, Simd<T>::range_absmin_sign(c.v.x[i], c.r.x[i]));
}

}  // namespace FK_CPU_ISA
}  // namespace fk
