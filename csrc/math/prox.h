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
//
// Regimes (all exact, checked against brute-force 1-D minimisation in tests/test_prox_bruteforce.py):
//   MCP(lam, gamma),  s <  gamma : firm threshold                    (kMcpFirm)
//                     s >= gamma : hard threshold at lam*sqrt(s*gamma) (kMcpHard)
//   SCAD(lam, a),     s <  a - 1 : four-piece closed form            (kScadSmall)
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
  kNumProxImpl = 9,
};

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

// The largest finite non-negative T with scad_large_gap <= 0 (bisection over T's ordered bit
// patterns): for every T value t, "t <= this" is then exactly "D(t) <= 0", ties to x1 (the smaller).
template <typename T, typename U>
T scad_large_tie(double s, double lam, double a) {
  static_assert(sizeof(T) == sizeof(U), "bit pattern type");
  auto value = [](U bits) {
    T t;
    __builtin_memcpy(&t, &bits, sizeof t);
    return t;
  };
  const T top = std::numeric_limits<T>::max();
  if (scad_large_gap(top, s, lam, a) <= 0) return top;
  U lo = 0, hi;  // D(value(lo)) <= 0 < D(value(hi))
  __builtin_memcpy(&hi, &top, sizeof hi);
  while (hi - lo > 1) {
    const U mid = lo + (hi - lo) / 2;
    (scad_large_gap(value(mid), s, lam, a) <= 0 ? lo : hi) = mid;
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
        plan.impl = kScadSmall;
        plan.c0 = s * lam;              // zero below
        plan.c1 = (1.0 + s) * lam;      // end of the soft-threshold piece
        plan.c2 = a * lam;              // identity above
        plan.c3 = s / (a - 1.0 - s);    // middle piece: x = t - c3 * (a lam - t)
        // ((a-1) t - s a lam) / (a-1-s) written so that no two large terms cancel: the old form
        // c3' t - c4' subtracted two numbers ~ a lam / (a-1-s) and lost everything near s = a - 1.
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
    r = r < t ? r : t;        // NaN t: r is NaN and the select yields t (NaN)
    r = r < T(0) ? T(0) : r;  // a NaN r falls through
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kMcpHard) {
    // c4 is the threshold rounded down to T: t <= c4 exactly when t <= lam sqrt(s gamma).
    return fk_abs(v) <= k.c4 ? fk_copysign(T(0), v) : v;
  } else if constexpr (IMPL == kScadSmall) {
    // Pieces: 0 (t <= s lam), t - s lam (t <= (1+s) lam), t - c3 (a lam - t) (t <= a lam), t.
    // The map is continuous and convex-then-linear: the steeper third piece (slope (a-1)/(a-1-s))
    // meets the second at (1+s) lam, lies below it before and above it after, so the result is
    // max(0, t - s lam, t - c3 max(a lam - t, 0)) with no boundary tests. The differences use the
    // two-term thresholds: c3 = s / (a-1-s) grows without bound as s -> a - 1, so a threshold off
    // by one rounding would move the result by c3 times that rounding.
    const T t = fk_abs(v);
    const T u0 = (t - k.c0) - k.lo0;  // t - s lam
    T w = (k.c2 - t) + k.lo2;         // a lam - t
    w = w > T(0) ? w : T(0);          // identity above a lam
    T r = t - k.c3 * w;
    r = r < u0 ? u0 : r;              // NaN: both are NaN
    r = r < T(0) ? T(0) : r;
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kScadLarge) {
    // The candidates' objectives are compared once, on the host: t <= c4 (the tie point t*, the
    // largest T value whose x1 objective is at most x3's, see scad_large_tie) picks x1.
    const T t = fk_abs(v);
    T x1 = (t - k.c0) - k.lo0;
    x1 = x1 < T(0) ? T(0) : x1;
    x1 = x1 > k.c1 ? k.c1 : x1;
    const T x3 = t < k.c2 ? k.c2 : t;  // NaN t falls through to x3 = NaN
    const T r = t <= k.c4 ? x1 : x3;
    return fk_copysign(r, v);
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
