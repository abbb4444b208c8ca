// Per-element proximal maps: the ONLY place these formulas are written (docs/algorithms.md §2).
//
//   prox_{s p}(v) = argmin_u  s * p(u) + (u - v)^2 / 2
//
// Every separable penalty is handled in two steps:
//   1. plan_prox()  (host, once per call): validates nothing (Python did), picks the formula for the
//      regime the step falls in, and folds the step and the penalty's parameters into a handful of
//      coefficients, so that the per-element code has no divisions, square roots or regime tests.
//   2. prox_elem<IMPL>() (host and device, per element): a branch-free select chain on |v|, then the
//      sign of v is copied back. GCC turns these selects into blends and vectorizes the loops.
//      Where a piecewise map is the max or min of its pieces it is written so (one max/min
//      instruction instead of a compare and a blend), keeping MCP and SCAD close to L1's cost.
//      In cache these loops are bound by the vector pipes, not by memory: a subtraction can run
//      as an FMA with a factor of 1 (same bits, fk_sub_m) on the multiply pipes while the add
//      pipes take the compares and max/min, and the sign goes back with one OR where the result
//      is >= +0. SCAD's small step is written once for a lane type (scad_small), so that the
//      AVX-512 variant runs it on blocks of vectors whose cap and sign are one vrangeps. In-cache
//      time over L1's per call (64 K values, 1 thread, AVX-512, AMD EPYC Zen 5): SCAD small step
//      1.0 (float32; float64 1.15), near its regime edge (two-term thresholds, float32) 1.2, large
//      step 1.1; MCP 1.1 (firm) and 1.0 (hard) (docs/performance.md, "MCP and SCAD in cache").
//
// Regimes (all exact, checked against brute-force 1-D minimisation in tests/test_prox_bruteforce.py):
//   MCP(lam, gamma),  s <  gamma : firm threshold                    (kMcpFirm)
//                     s >= gamma : hard threshold at lam*sqrt(s*gamma) (kMcpHard)
//   SCAD(lam, a),     s <  a - 1 : four-piece closed form            (kScadSmall, or kScadSmallEdge
//                                  where c3 = s / (a-1-s) has c3 a > 1: two-term thresholds)
//                     s >= a - 1 : best of the two candidates
//                                  x1 = clip(t - s lam, 0, lam), x3 = max(t, a lam) (kScadLarge):
//                                  x1 up to the tie point t* (planned on the host), x3 above
// At an exact tie between two minimizers the smaller magnitude is returned (0 for MCP). In float32,
// results stay within a few ulps of the exact prox up to the regime edges s -> gamma and s -> a - 1,
// where the middle pieces' slopes grow without bound (see ProxCoef; tests/test_prox_regime_edge.py).
//
// NaN policy: a NaN input gives NaN at that element (every select is written so that a NaN
// comparison falls through to a branch that carries v). +-Inf maps as the formula's limit: +-Inf for
// L1/MCP/SCAD/elastic net, the bound for box, 0 for -Inf under non-negativity.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "common.h"

namespace fk {

// Penalty kinds as Python names them (fedkernels/_backend.py keeps the same table).
enum ProxKind : int {
  kKindZero = 0,
  kKindL1 = 1,          // p1 = kappa
  kKindElasticNet = 2,  // p1 = l1, p2 = l2
  kKindMCP = 3,         // p1 = lam, p2 = gamma
  kKindSCAD = 4,        // p1 = lam, p2 = a
  kKindBox = 5,         // p1 = lo, p2 = hi (scalar bounds)
  kKindNonNeg = 6,
};

// Regime-resolved formulas; kernels are instantiated once per IMPL so that no per-element switch
// or function pointer exists.
enum ProxImpl : int {
  kIdentity = 0,
  kSoftThreshold = 1,
  kElasticNet = 2,
  kMcpFirm = 3,
  kMcpHard = 4,
  kScadSmall = 5,
  kScadLarge = 6,
  kClip = 7,
  kNonNeg = 8,
  kScadSmallEdge = 9,  // kScadSmall's formula with two-term thresholds (s / (a-1-s) * a > 1)
  kNumProxImpl = 10,
};

// The formula that compute type T runs for a planned impl: in float64 the two-term rests are 0, so
// kScadSmallEdge is kScadSmall there (one instantiation: the same loop, not a second copy of it).
template <typename T>
constexpr int impl_for(int impl) {
  return impl == kScadSmallEdge && sizeof(T) == sizeof(double) ? kScadSmall : impl;
}

// Coefficients of one planned prox, in double on the host; kernels narrow them to their compute type.
struct ProxPlan {
  int impl = kIdentity;
  double c0 = 0, c1 = 0, c2 = 0, c3 = 0, c4 = 0;
  float lo0 = 0, lo1 = 0, lo2 = 0;  // c0..c2 minus their float32 roundings (see ProxCoef)
  float f4 = 0;                     // c4 as a float32 threshold where c4 is one (kScadLarge's t*)
};

// SCAD's large-step objective difference D(t) = [s p(x1) + (x1 - t)^2 / 2] - [s p(x3) + (x3 - t)^2 / 2]
// for t = |v| >= 0, in long double. D' = x3 - x1 > 0, so D rises through 0 exactly once: x1 is the
// minimizer up to that tie point, x3 above it.
inline long double scad_large_gap(long double t, double s, double lam, double a) {
  const long double sl = static_cast<long double>(s) * lam, al = static_cast<long double>(a) * lam;
  long double x1 = t - sl;
  x1 = x1 < 0 ? 0 : (x1 > lam ? static_cast<long double>(lam) : x1);
  const long double x3 = t < al ? al : t;
  const long double e1 = x1 - t, e3 = x3 - t;
  return (sl * x1 + 0.5L * e1 * e1) - (sl * lam * (a + 1.0L) * 0.5L + 0.5L * e3 * e3);
}

// The largest finite non-negative T with scad_large_gap <= 0: for every T value t, "t <= this" is
// then exactly "D(t) <= 0", ties to x1 (the smaller). Searched over T's ordered bit patterns from the
// closed-form root, lam (1 + a + s) / 2 where x1 = t - s lam and x3 = t meet (s <= a + 1), else
// lam sqrt(s (a + 1)) (x1 = 0): doubling steps away from it until D changes sign, then bisection.
// The bracket's ends are a few ulps apart, so a plan costs ~10 evaluations of D instead of one per
// bit of T (a bisection over all of T's values took ~1.5 us per call, as long as L1's prox of
// 64 K float32 values in cache).
template <typename T, typename U>
T scad_large_tie(double s, double lam, double a) {
  static_assert(sizeof(T) == sizeof(U), "bit pattern type");
  auto value = [](U bits) {
    T t;
    __builtin_memcpy(&t, &bits, sizeof t);
    return t;
  };
  auto bits_of = [](T t) {
    U u;
    __builtin_memcpy(&u, &t, sizeof u);
    return u;
  };
  const T top = std::numeric_limits<T>::max();
  const U top_bits = bits_of(top);
  auto rises = [&](U bits) { return scad_large_gap(value(bits), s, lam, a) > 0; };
  if (!rises(top_bits)) return top;
  const double root = s <= a + 1.0 ? lam * (1.0 + a + s) * 0.5 : lam * std::sqrt(s * (a + 1.0));
  const T guess = root >= 0 && root < static_cast<double>(top) ? static_cast<T>(root) : top;  // NaN: top
  // lo: D(lo) <= 0 < D(hi); D(0) < 0 and D(top) > 0 bound every step
  U lo, hi;
  U step = 1;
  if (rises(bits_of(guess))) {
    hi = bits_of(guess);
    lo = hi;
    do {
      hi = lo;
      lo = hi > step ? hi - step : 0;
      step *= 2;
    } while (lo > 0 && rises(lo));
  } else {
    lo = bits_of(guess);
    hi = lo;
    do {
      lo = hi;
      hi = top_bits - lo > step ? lo + step : top_bits;
      step *= 2;
    } while (!rises(hi));
  }
  while (hi - lo > 1) {
    const U mid = lo + (hi - lo) / 2;
    (rises(mid) ? hi : lo) = mid;
  }
  return value(lo);
}

// The rest of c beyond its float32 rounding, as a float. Computed once on the host, in plan_prox:
// GCC 12's SLP vectorizer at -O2/-O3 without AVX (the baseline CPU variant) folded this expression
// to 0 when it was written inside the kernels' coefficient constructor.
__attribute__((noinline)) inline float float_rest(double c) {
  return static_cast<float>(c - static_cast<double>(static_cast<float>(c)));
}

// Narrowed coefficients. A threshold that a regime's formula subtracts from |v| and then multiplies
// by a large slope (MCP's gamma / (gamma - s) and SCAD's s / (a - 1 - s) grow without bound as the
// step nears the regime edge) is also kept as a two-term sum hi + lo (hi = the threshold rounded to
// T, lo = the rest, from the plan): (t - hi) - lo is then t minus the double threshold to within
// one rounding of the difference (t - hi is exact near hi, Sterbenz), so neither the difference nor
// the sign test on it (which piece t is in) carries the threshold's own rounding error. In float64
// the lo terms are 0.
template <typename T>
struct ProxCoef {
  T c0, c1, c2, c3, c4;
  T lo0, lo1, lo2;
  T one = T(1), zero = T(0);
  explicit ProxCoef(const ProxPlan& p)
      : c0(static_cast<T>(p.c0)),
        c1(static_cast<T>(p.c1)),
        c2(static_cast<T>(p.c2)),
        c3(static_cast<T>(p.c3)),
        c4(sizeof(T) == sizeof(float) ? static_cast<T>(p.f4) : static_cast<T>(p.c4)),
        lo0(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo0) : T(0)),
        lo1(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo1) : T(0)),
        lo2(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo2) : T(0)) {}
};

// Host-side planning. `step` is the effective prox step s >= 0 (already multiplied by any outer
// strength kappa, docs/algorithms.md §1.3). Parameters are assumed valid (Python validates them).
inline ProxPlan plan_prox(int kind, double step, double p1, double p2) {
  ProxPlan plan;
  const double s = step;
  switch (kind) {
    case kKindZero:
      plan.impl = kIdentity;
      break;
    case kKindL1:
      plan.impl = kSoftThreshold;
      plan.c0 = s * p1;  // threshold
      break;
    case kKindElasticNet:
      plan.impl = kElasticNet;
      plan.c0 = s * p1;               // threshold
      plan.c1 = 1.0 / (1.0 + s * p2);  // shrink factor
      break;
    case kKindMCP: {
      const double lam = p1, gamma = p2;
      if (s < gamma) {
        plan.impl = kMcpFirm;
        plan.c0 = s * lam;              // zero below
        plan.c1 = gamma * lam;          // identity above (kept for the docs; the kernel clamps at t)
        plan.c2 = gamma / (gamma - s);  // slope of the middle piece
      } else {
        plan.impl = kMcpHard;
        plan.c0 = lam * std::sqrt(s * gamma);  // hard threshold
        plan.c4 = plan.c0;                     // zero up to here: in float32 the largest float <= c0
        plan.f4 = static_cast<float>(plan.c0);
        if (static_cast<double>(plan.f4) > plan.c0) plan.f4 = std::nextafter(plan.f4, 0.0f);
      }
      break;
    }
    case kKindSCAD: {
      const double lam = p1, a = p2;
      if (s < a - 1.0) {
        plan.c0 = s * lam;              // zero below
        plan.c1 = (1.0 + s) * lam;      // end of the soft-threshold piece
        plan.c2 = a * lam;              // identity above
        plan.c3 = s / (a - 1.0 - s);    // middle piece: x = t - c3 * (a lam - t)
        // ((a-1) t - s a lam) / (a-1-s) written so that no two large terms cancel: the old form
        // c3' t - c4' subtracted two numbers ~ a lam / (a-1-s) and lost everything near s = a - 1.
        // One rounding of a lam (relative <= u, the unit roundoff: 2^-24 in float32) moves the
        // middle piece t + c3 (t - a lam) by at most c3 u a lam. That piece is >= lam (it rises
        // from lam at t = (1+s) lam), and an ulp of a value r is more than u r, so for c3 a <= 1
        // the one-term a lam costs less than one ulp of the result, and kScadSmall takes it; past
        // that (the slope c3 grows without bound as s -> a - 1) kScadSmallEdge keeps the two-term
        // thresholds, which make the middle piece exact to a few roundings for every c3.
        plan.impl = plan.c3 * a <= 1.0 ? kScadSmall : kScadSmallEdge;
      } else {
        plan.impl = kScadLarge;
        plan.c0 = s * lam;                             // soft threshold of candidate x1
        plan.c1 = lam;                                 // x1 is clipped to [0, lam]
        plan.c2 = a * lam;                             // x3 = max(t, a lam)
        plan.c3 = s * lam * lam * (a + 1.0) * 0.5;     // s * p(x3), constant on [a lam, inf)
        plan.c4 = scad_large_tie<double, uint64_t>(s, lam, a);  // x1 up to here, x3 above
        plan.f4 = scad_large_tie<float, uint32_t>(s, lam, a);
      }
      break;
    }
    case kKindBox:
      plan.impl = kClip;
      plan.c0 = p1;
      plan.c1 = p2;
      break;
    case kKindNonNeg:
      plan.impl = kNonNeg;
      break;
    default:
      plan.impl = -1;  // rejected by the caller
  }
  plan.lo0 = float_rest(plan.c0);
  plan.lo1 = float_rest(plan.c1);
  plan.lo2 = float_rest(plan.c2);
  return plan;
}

FK_HD float fk_abs(float x) { return fabsf(x); }
FK_HD double fk_abs(double x) { return fabs(x); }
FK_HD float fk_copysign(float m, float s) { return copysignf(m, s); }
FK_HD double fk_copysign(double m, double s) { return copysign(m, s); }

// x - c as fma(x, one, -c) in the CPU variants with FMA (one = 1 at run time, so that the compiler
// keeps the FMA): x * 1 is exact, so the FMA rounds x - c once, as the subtraction does (same bits),
// but it issues on the multiply pipes, which the add pipes' compares and subtractions leave idle.
// Chosen by measurement (AMD Zen 5, in cache, 64 K values): SCAD's small step (t - a lam; the add
// pipes take its other subtraction and 3 max/min) gains in every variant; SCAD's large step gains in AVX2
// (5.1 against 8.2 us: its blend shares the add pipes there) but loses in AVX-512 (2.57 against
// 2.33 us: the FMA's longer latency), so it passes avx512 = false; MCP firm subtracts plainly.
FK_HD float fk_sub_m(float x, float c, float one, bool avx512 = true) {
#if defined(__FMA__) && !defined(__CUDA_ARCH__)
#if defined(__AVX512F__)
  if (!avx512) return x - c;
#endif
  return __builtin_fmaf(x, one, -c);
#else
  (void)one, (void)avx512;
  return x - c;
#endif
}
FK_HD double fk_sub_m(double x, double c, double one, bool avx512 = true) {
#if defined(__FMA__) && !defined(__CUDA_ARCH__)
#if defined(__AVX512F__)
  if (!avx512) return x - c;
#endif
  return __builtin_fma(x, one, -c);
#else
  (void)one, (void)avx512;
  return x - c;
#endif
}
// a * b + c rounded once, in every variant and on the device: one FMA instruction where the
// variant has one (AVX2, AVX-512, CUDA), the correctly rounded libm call elsewhere (the baseline
// variant and the host emulation of CUDA: same bits, slower: the baseline loop stays scalar).
// Never a * b + c with two roundings, so that every variant gives the same bits.
FK_HD float fk_fma(float a, float b, float c) { return fmaf(a, b, c); }
FK_HD double fk_fma(double a, double b, double c) { return fma(a, b, c); }
// max(x, z) and min(x, z) that return a NaN x: z > x ? z : x is one max instruction (maxps takes
// its second operand when either is NaN), with z a run-time coefficient (a literal 0 made GCC
// emit a compare and a mask instead).
template <typename T>
FK_HD T fk_max_keep_nan(T x, T z) { return z > x ? z : x; }
template <typename T>
FK_HD T fk_min_keep_nan(T x, T z) { return z < x ? z : x; }

// v's sign bit alone (+-0), |v| as v without it, and r | sign: for r >= +0 (or a NaN without its
// sign bit) this is copysign(r, v) in one OR. Bit operations, so the compiler cannot re-derive the
// result from the loaded v (it turned copysign(|v|, v) into a second, masked load of v). A -0 r (only
// from a tiny negative difference flushed to zero under FTZ) keeps its sign bit, in every variant alike
// (SCAD's small step's integer max gives +0 there).
FK_HD float fk_bits_or(float a, float b) { return bits_to_float(float_to_bits(a) | float_to_bits(b)); }
FK_HD float fk_bits_xor(float a, float b) { return bits_to_float(float_to_bits(a) ^ float_to_bits(b)); }
FK_HD float fk_sign_bit(float v) { return bits_to_float(float_to_bits(v) & 0x80000000u); }
FK_HD double fk_bits_or(double a, double b) { return bits_to_double(double_to_bits(a) | double_to_bits(b)); }
FK_HD double fk_bits_xor(double a, double b) { return bits_to_double(double_to_bits(a) ^ double_to_bits(b)); }
FK_HD double fk_sign_bit(double v) { return bits_to_double(double_to_bits(v) & 0x8000000000000000ull); }

// max of two floats compared as signed 32-bit integers (their bit patterns): for x, z not both
// negative this is the order of their values, with +0 above -0 and a NaN without its sign bit above
// every number; so fk_imax(x, +0) is max(x, 0) with +0 (never -0) for x <= 0. Integer operations:
// every variant and the device give the same bits in every FP mode. One vpmaxsd in AVX2 and AVX-512,
// which AMD Zen 5 issues on any of its four vector pipes (1 per cycle each), while a float max or min
// shares the two add pipes with the subtractions. (The bits go through __builtin_bit_cast: through
// memcpy, GCC 12 compared and blended.)
FK_HD int32_t fk_int_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(x);
#elif defined(__CUDACC__)
  return static_cast<int32_t>(float_to_bits(x));
#else
  return __builtin_bit_cast(int32_t, x);
#endif
}
FK_HD float fk_from_int_bits(int32_t i) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(i);
#elif defined(__CUDACC__)
  return bits_to_float(static_cast<uint32_t>(i));
#else
  return __builtin_bit_cast(float, i);
#endif
}
FK_HD float fk_imax(float x, float z) {
  const int32_t a = fk_int_bits(x), b = fk_int_bits(z);
  return fk_from_int_bits(a > b ? a : b);
}

// The steps of scad_small below that differ by lane type. |v| (as bits: with fk_abs, fabs, GCC
// compiled float64's step in AVX-512 to 1.18-1.20 x L1 in cache instead of 1.13-1.14); max(x, 0);
// mid's identity cap, either on t - a lam (fk_cap_q: mid = t + c3 min(t - a lam, 0) is then <= t)
// or on the result; and copysign(max(u0, mid) capped at t, v), for t = |v| and +0 <= u0 <= t (or all
// three t's NaN).
// - float32 takes its max with 0 and of the pieces as integer max of the bit patterns (fk_imax, off
//   the add pipes), and caps the result: max(u0, min(mid, t)), with the min first so that the compiler
//   keeps it a min (taken last, GCC merged it with the sign's OR into a compare and a blend, 2 more
//   instructions in AVX2). csrc/cpu/lanes_avx512.h takes the max first and then min(., t) and the
//   sign as one vrangeps: with u0 <= t, max(u0, min(mid, t)) = min(max(u0, mid), t).
// - float64 takes float max (AVX2 has no 64-bit integer max: 2 instructions) and caps t - a lam
//   (its min with t was a compare and a masked AND in AVX-512, 1.32 x L1 in cache against 1.16).
// The same values in every form; an integer max gives +0 where a float max keeps a -0 (a tiny
// negative t - s lam flushed to zero under FTZ). A NaN t gives its NaN, made quiet by the
// subtractions, with v's sign.
FK_HD float fk_magnitude(float v) { return bits_to_float(float_to_bits(v) & 0x7fffffffu); }
FK_HD double fk_magnitude(double v) { return bits_to_double(double_to_bits(v) & 0x7fffffffffffffffull); }
FK_HD float fk_max0(float x, float zero) { return fk_imax(x, zero); }
FK_HD double fk_max0(double x, double zero) { return fk_max_keep_nan(x, zero); }
FK_HD float fk_cap_q(float q, float /*zero*/) { return q; }
FK_HD double fk_cap_q(double q, double zero) { return fk_min_keep_nan(q, zero); }
FK_HD float fk_max_cap_sign(float u0, float mid, float t, float v) {
  return fk_bits_or(fk_imax(u0, t < mid ? t : mid), fk_sign_bit(v));
}
FK_HD double fk_max_cap_sign(double u0, double mid, double /*t*/, double v) {
  return fk_bits_or(fk_max_keep_nan(u0, mid), fk_sign_bit(v));
}

// SCAD's small step (s < a - 1), for a lane type V: float or double (every CPU variant's compiled
// loops, the device) and, in float32, the AVX-512 variant's blocks of 16-lane vectors, which its prox
// loop runs on whole blocks (csrc/cpu/kernels.cpp, LaneBlocks), with the same bits.
// Pieces: 0 (t <= s lam), t - s lam (t <= (1+s) lam), t - c3 (a lam - t) (t <= a lam), t. The map is
// continuous and convex-then-linear: the steeper third piece mid = t + c3 (t - a lam) (slope 1 + c3)
// meets the second at (1+s) lam, lies below it before and above it after, and lies below t up to
// a lam and above it past a lam, so the result is max(t - s lam, 0, mid) capped at t, with no
// boundary tests; the product and the sum are one FMA (fk_fma: same bits in every variant and on
// the device). In AVX-512 blocks the cap and v's sign are one vrangeps (the smaller magnitude of v
// and r, with v's sign).
// TwoTerm (kScadSmallEdge in float32: c3 = s / (a-1-s) has c3 a > 1, up to unbounded as s -> a - 1):
// t - a lam, which c3 multiplies, must be exact to one rounding of the difference (a lam's own
// rounding times c3 would cost more than an ulp of the result), and so must t - s lam near s lam
// (tests/test_prox_regime_edge.py holds every result to 2 ulps): both thresholds are two-term. Else
// (kScadSmall, c3 a <= 1, see plan_prox; float64 always: its lo terms are 0) one rounding of a lam
// costs less than an ulp of the result and t - s lam is L1's own soft threshold. Error bounds:
// tests/test_prox_scad_small.py. One subtraction of each is an FMA (fk_sub_m) on the multiply pipes.
// Per AVX-512 vector: two-term 9 instructions (and, 4 sub, 2 integer max, fma, range), one-term 7,
// against the compiled loops' 10 and 8 (their cap is a min, their sign an OR) and L1's 4. In cache
// (AMD Zen 5, 64 K float32 values, 1 thread, the loops alone) the two-term block loop takes 2.37
// against the compiled loop's 3.0 us; L1's soft threshold 1.95 us.
template <bool TwoTerm, class V>
FK_HD auto scad_small(V v, V c0, V lo0, V c2, V lo2, V c3, V zero, V one) {
  const V t = fk_magnitude(v);
  V e0, e2;  // t - s lam, t - a lam
  if constexpr (TwoTerm) {
    e0 = fk_sub_m(t - c0, lo0, one);
    e2 = (t - c2) - lo2;
  } else {
    (void)lo0, (void)lo2;
    e0 = t - c0;
    e2 = fk_sub_m(t, c2, one);
  }
  return fk_max_cap_sign(fk_max0(e0, zero), fk_fma(c3, fk_cap_q(e2, zero), t), t, v);
}

template <int IMPL, typename T>
FK_HD T prox_elem(T v, const ProxCoef<T>& k) {
  if constexpr (IMPL == kIdentity) {
    return v;
  } else if constexpr (IMPL == kSoftThreshold) {
    const T t = fk_abs(v);
    const T r = t <= k.c0 ? T(0) : t - k.c0;
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kElasticNet) {
    const T t = fk_abs(v);
    const T r = t <= k.c0 ? T(0) : (t - k.c0) * k.c1;
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kMcpFirm) {
    // (t - s lam) * gamma / (gamma - s) on (s lam, gamma lam], t above, 0 below. The slope grows
    // without bound as s -> gamma, so t - s lam is taken with the two-term threshold; the middle
    // piece meets the identity at t = gamma lam, so min(., t) is the upper piece and keeps
    // |prox(v)| <= |v| under rounding (the exact firm threshold never increases |v|).
    // Below s lam, u <= 0 makes u * c2 <= 0 (c2 > 0), so a max with 0 is the zero piece.
    const T t = fk_abs(v);
    const T u = (t - k.c0) - k.lo0;
    T r = u * k.c2;
    r = r < t ? r : t;                 // NaN t: r is NaN and the select yields t (NaN)
    if constexpr (sizeof(T) == sizeof(float)) {
      // The max with 0 as an integer one (fk_imax, off the add pipes, which the two subtractions and
      // the min take), which gives +0 where the float max kept a -0: then OR-ing v's sign bit back is
      // the copysign (same bits). AVX2: 8 vector instructions, 3 on the add pipes (9 and 4 before).
      return fk_bits_or(fk_imax(r, k.zero), fk_sign_bit(v));
    }
    r = fk_max_keep_nan(r, k.zero);
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kMcpHard) {
    // c4 is the threshold rounded down to T: t <= c4 exactly when t <= lam sqrt(s gamma).
    const T sign = fk_sign_bit(v), t = fk_bits_xor(v, sign);
    return fk_bits_or(t <= k.c4 ? T(0) : t, sign);
  } else if constexpr (IMPL == kScadSmall || IMPL == kScadSmallEdge) {
    constexpr bool two_term = IMPL == kScadSmallEdge && sizeof(T) == sizeof(float);
    return scad_small<two_term>(v, k.c0, k.lo0, k.c2, k.lo2, k.c3, k.zero, k.one);
  } else if constexpr (IMPL == kScadLarge) {
    // The candidates' objectives are compared once, on the host: t <= c4 (the tie point t*, the
    // largest T value whose x1 objective is at most x3's, see scad_large_tie) picks x1. Above it
    // x3 = max(t, a lam) is t: t* >= a lam in this regime (D(a lam) <= 0 for s >= a - 1), so every
    // T value above c4 is at least a lam rounded to T.
    const T sign = fk_sign_bit(v), t = fk_bits_xor(v, sign);
    T x1 = fk_sub_m(fk_sub_m(t, k.c0, k.one, false), k.lo0, k.one, false);
    x1 = fk_max_keep_nan(x1, k.zero);
    x1 = x1 > k.c1 ? k.c1 : x1;
    return fk_bits_or(t <= k.c4 ? x1 : t, sign);
  } else if constexpr (IMPL == kClip) {
    T r = v > k.c1 ? k.c1 : v;
    return v < k.c0 ? k.c0 : r;
  } else if constexpr (IMPL == kNonNeg) {
    return v < T(0) ? T(0) : v;
  } else {
    static_assert(IMPL >= 0 && IMPL < kNumProxImpl, "unknown prox impl");
    return v;
  }
}

}  // namespace fk
