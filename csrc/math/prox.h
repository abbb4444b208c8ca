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
//
// Regimes (all exact, checked against brute-force 1-D minimisation in tests/test_prox_bruteforce.py):
//   MCP(lam, gamma),  s <  gamma : firm threshold                    (kMcpFirm)
//                     s >= gamma : hard threshold at lam*sqrt(s*gamma) (kMcpHard)
//   SCAD(lam, a),     s <  a - 1 : four-piece closed form            (kScadSmall)
//                     s >= a - 1 : best of the two candidates
//                                  x1 = clip(t - s lam, 0, lam), x3 = max(t, a lam) (kScadLarge)
// At an exact tie between two minimizers the smaller magnitude is returned (0 for MCP). In float32,
// results stay within a few ulps of the exact prox up to the regime edges s -> gamma and s -> a - 1,
// where the middle pieces' slopes grow without bound (see ProxCoef; tests/test_prox_regime_edge.py).
//
// NaN policy: a NaN input gives NaN at that element (every select is written so that a NaN
// comparison falls through to a branch that carries v). +-Inf maps as the formula's limit: +-Inf for
// L1/MCP/SCAD/elastic net, the bound for box, 0 for -Inf under non-negativity.
#pragma once

#include <cmath>

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
};

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
  double d0, d3;  // SCAD's large-step objectives, compared in double (see prox_elem)
  explicit ProxCoef(const ProxPlan& p)
      : c0(static_cast<T>(p.c0)),
        c1(static_cast<T>(p.c1)),
        c2(static_cast<T>(p.c2)),
        c3(static_cast<T>(p.c3)),
        c4(static_cast<T>(p.c4)),
        lo0(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo0) : T(0)),
        lo1(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo1) : T(0)),
        lo2(sizeof(T) == sizeof(float) ? static_cast<T>(p.lo2) : T(0)),
        d0(p.c0),
        d3(p.c3) {}
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
    const T t = fk_abs(v);
    const T u = (t - k.c0) - k.lo0;
    T r = u * k.c2;
    r = r < t ? r : t;  // NaN t: r is NaN and the select yields t (NaN)
    r = u <= T(0) ? T(0) : r;
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kMcpHard) {
    const T t = fk_abs(v);
    const T u = (t - k.c0) - k.lo0;  // exact sign of t - lam sqrt(s gamma)
    return u <= T(0) ? fk_copysign(T(0), v) : v;
  } else if constexpr (IMPL == kScadSmall) {
    // Pieces: 0 (t <= s lam), t - s lam (t <= (1+s) lam), t - c3 (a lam - t) (t <= a lam), t.
    // Each boundary test and difference uses the two-term thresholds: c3 = s / (a-1-s) grows
    // without bound as s -> a - 1, so a threshold off by one rounding would move the result by
    // c3 times that rounding.
    const T t = fk_abs(v);
    const T u0 = (t - k.c0) - k.lo0;  // t - s lam
    const T u1 = (t - k.c1) - k.lo1;  // t - (1+s) lam
    T w = (k.c2 - t) + k.lo2;         // a lam - t
    w = w > T(0) ? w : T(0);          // identity above a lam
    T r = t - k.c3 * w;
    r = u1 <= T(0) ? u0 : r;
    r = u0 <= T(0) ? T(0) : r;
    return fk_copysign(r, v);
  } else if constexpr (IMPL == kScadLarge) {
    const T t = fk_abs(v);
    T x1 = (t - k.c0) - k.lo0;
    x1 = x1 < T(0) ? T(0) : x1;
    x1 = x1 > k.c1 ? k.c1 : x1;
    const T x3 = t < k.c2 ? k.c2 : t;
    // s * p(x1) = s * lam * x1 = c0 * x1 on [0, lam]; compare the full objectives in double: near
    // the jump between the candidates they differ by less than a float32 rounding of either.
    const double td = static_cast<double>(t), e1 = static_cast<double>(x1) - td, e3 = static_cast<double>(x3) - td;
    const double obj1 = k.d0 * static_cast<double>(x1) + 0.5 * e1 * e1;
    const double obj3 = k.d3 + 0.5 * e3 * e3;
    const T r = obj1 <= obj3 ? x1 : x3;
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
