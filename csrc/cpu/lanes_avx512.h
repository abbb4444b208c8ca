// A block of 16-lane float32 vectors with the operations of csrc/math/prox.h's lane-generic formulas
// (scad_small_edge), for the AVX-512 variant's loops. Each operation is one instruction per vector
// with the scalar function's bits: the same IEEE operation (sub; fk_sub_m's x * 1 - c as one FMA;
// fma), the same integer max of bit patterns, and fk_max_cap_sign's min and sign as one vrangeps
// (AVX-512 DQ, which the variant requires).
//
// An operation runs on all N vectors before the next one starts, so the instructions of N
// independent elements' chains sit side by side: the formula's chain is ~16 cycles deep, and with
// N = 8 the core finds 8 ready chains where one vector at a time left its pipes idle (AMD Zen 5,
// SCAD's edge step in cache: 2.36 against 2.45 us per 64 K values).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fk {
namespace FK_CPU_ISA {

template <int N>
struct F32Block {
  static constexpr int64_t kValues = 16 * N;
  __m512 x[N];
};

template <int N, class F>
inline F32Block<N> each(F&& f) {
  F32Block<N> out;
  for (int i = 0; i < N; ++i) out.x[i] = f(i);
  return out;
}
template <int N>
inline F32Block<N> splat(float c) {
  return each<N>([&](int) { return _mm512_set1_ps(c); });
}
template <int N>
inline F32Block<N> load_block(const float* p) {
  return each<N>([&](int i) { return _mm512_loadu_ps(p + 16 * i); });
}
template <int N>
inline void store_block(float* p, const F32Block<N>& v) {
  for (int i = 0; i < N; ++i) _mm512_storeu_ps(p + 16 * i, v.x[i]);
}

inline __m512i as_int(__m512 a) { return _mm512_castps_si512(a); }

template <int N>
inline F32Block<N> operator-(const F32Block<N>& a, const F32Block<N>& b) {
  return each<N>([&](int i) { return _mm512_sub_ps(a.x[i], b.x[i]); });
}
template <int N>
inline F32Block<N> fk_sub_m(const F32Block<N>& a, const F32Block<N>& b, const F32Block<N>& one) {
  return each<N>([&](int i) { return _mm512_fmsub_ps(a.x[i], one.x[i], b.x[i]); });
}
template <int N>
inline F32Block<N> fk_fma(const F32Block<N>& a, const F32Block<N>& b, const F32Block<N>& c) {
  return each<N>([&](int i) { return _mm512_fmadd_ps(a.x[i], b.x[i], c.x[i]); });
}
template <int N>
inline F32Block<N> fk_imax(const F32Block<N>& a, const F32Block<N>& b) {
  return each<N>([&](int i) { return _mm512_castsi512_ps(_mm512_max_epi32(as_int(a.x[i]), as_int(b.x[i]))); });
}
template <int N>
inline F32Block<N> fk_magnitude(const F32Block<N>& v) {
  return each<N>([&](int i) {
    return _mm512_castsi512_ps(_mm512_and_si512(as_int(v.x[i]), _mm512_set1_epi32(0x7fffffff)));
  });
}
// min(max(u0, mid), t) with v's sign: vrangeps imm 0x02 returns the operand of smaller magnitude
// (|v| = t, or r = max(u0, mid) >= +0) with the first one's sign (v's); a NaN v (r is then NaN too)
// gives v made quiet, which is the scalar's result there. The max is taken here; the range waits for
// the store (store_block below), which runs it vector by vector, each result stored as soon as it is
// computed. Stored after all N, the results left the compiler free to load v again from memory for
// the range instead of keeping it in a register: one more load a vector, 2.47 against 2.37 us per
// 64 K values in cache (AMD Zen 5).
template <int N>
struct CappedBlock {
  F32Block<N> r, v;
};
template <int N>
inline CappedBlock<N> fk_max_cap_sign(const F32Block<N>& u0, const F32Block<N>& mid, const F32Block<N>& /*t*/,
                                      const F32Block<N>& v) {
  return {fk_imax(u0, mid), v};
}
template <int N>
inline void store_block(float* p, const CappedBlock<N>& c) {
  for (int i = 0; i < N; ++i) _mm512_storeu_ps(p + 16 * i, _mm512_range_ps(c.v.x[i], c.r.x[i], 0x02));
}

}  // namespace FK_CPU_ISA
}  // namespace fk
