// Per-element bodies of the fused federated updates (docs/algorithms.md §4, §7.1): the only place these
// update rules are written. All arguments are in the compute type T (float for 16-bit storage).
#pragma once

#include "prox.h"

namespace fk {

// Control-variate local step (FedCanon / SCAFFOLD client step):  x <- x - beta * (g + c).
template <typename T>
FK_HD T cv_step_elem(T x, T g, T c, T beta) {
  return x - beta * (g + c);
}

// FedCanon normalized client update:  Delta = (z - x) / (beta * K); `inv_scale` = 1 / (beta * K).
template <typename T>
FK_HD T normalized_delta_elem(T z, T x, T inv_scale) {
  return (z - x) * inv_scale;
}

// FedCanon / FedNMap control-variate update:  c <- c + dbar - d.
template <typename T>
FK_HD T control_update_elem(T c, T dbar, T d) {
  return c + (dbar - d);
}

// Proximal gradient step (FedCanon server step, Prox-FedAvg / FedMiD client step):
//   x <- prox_{s h}(x - lr * g)
template <int IMPL, typename T>
FK_HD T prox_grad_elem(T x, T g, T lr, const ProxCoef<T>& k) {
  return prox_elem<IMPL>(x - lr * g, k);
}

// FedNMap local step (5b) fused with the next step's prox (5a):
//   z <- z - eta * (g + c + (z - x) / lam);   x <- prox_{lam h}(z)
template <typename T>
struct NormalMapResult {
  T z, x;
};
template <int IMPL, typename T>
FK_HD NormalMapResult<T> normal_map_elem(T z, T x, T g, T c, T eta, T inv_lam,
                                               const ProxCoef<T>& k) {
  const T z_new = z - eta * (g + c + (z - x) * inv_lam);
  return {z_new, prox_elem<IMPL>(z_new, k)};
}

// ZA1 local step:  zhat <- zhat - eta * (g + c);   z <- prox_{(t+1) eta h}(zhat)
// is cv_step_elem followed by prox_elem (see Za1StepOp in csrc/ops.h).

// DEPOSITUM momentum + direction + prox (docs/algorithms.md §4.5, eqs. 10-12a before mixing):
//   m <- beta * m + w * y                    (w = 1 - beta normalized, A1; w = 1 unnormalized)
//   dir = m (SHB)   or   beta * m + w * y (SNAG)
//   x <- prox_{s h}(x - alpha * dir)
template <typename T>
struct MomentumResult {
  T m, x;
};
// `snag` is uniform over a launch, so the select costs one blend, not a branch.
template <int IMPL, typename T>
FK_HD MomentumResult<T> depositum_elem(T x, T m, T y, T alpha, T beta, T w, bool snag,
                                       const ProxCoef<T>& k) {
  const T m_new = beta * m + w * y;
  const T dir = snag ? beta * m_new + w * y : m_new;
  return {m_new, prox_elem<IMPL>(x - alpha * dir, k)};
}

// l2-ball projection, scale pass:  x <- c + (x - c) * min(1, r / ||x - c||).  `factor` is computed
// once per row from the reduced norm by l2_ball_factor().
template <typename T>
FK_HD T l2_ball_elem(T x, T center, T factor) {
  return center + (x - center) * factor;
}

// min(1, r / norm); a NaN norm gives NaN (the row becomes NaN rather than silently unprojected).
FK_HD double l2_ball_factor(double sumsq, double radius) {
  const double norm = sqrt(sumsq);
  return norm <= radius ? 1.0 : radius / norm;
}

// Group lasso (block soft-thresholding), scale pass:  x_g <- x_g * max(0, 1 - t / ||x_g||) with
// t = step * lam; the factor is computed once per group from the reduced sum of squares. A group at
// or below the threshold (including an all-zero group) becomes 0; a NaN norm gives NaN (the group
// becomes NaN, as an l2-ball row does); an infinite norm gives 1 (the limit of the formula).
FK_HD double group_lasso_factor(double sumsq, double threshold) {
  const double norm = sqrt(sumsq);
  if (norm != norm) return norm;
  return norm <= threshold ? 0.0 : 1.0 - threshold / norm;
}

}  // namespace fk
