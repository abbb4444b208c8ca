// Elementwise operations on flat buffers: one argument struct (dtype-erased pointers, as bound from
// Python) and one functor per op. A functor is the per-thread body of both backends: the CPU loops
// call op(r, j) for every element, the CUDA kernel calls it from each thread, and the host
// emulation of a CUDA launch (tests) calls it with emulated thread indices.
//
// Layout: every buffer is a contiguous [rows, cols] block (rows = 1 for a single model). An operand
// marked "row-broadcast" may instead be a single [cols] vector shared by all rows (row stride 0),
// e.g. the server's dbar against a [N, d] stack of client controls.
#pragma once

#include <cstdint>

#include "math/common.h"
#include "math/prox.h"
#include "math/reduce.h"
#include "math/updates.h"

namespace fk {

// One operand: base pointer and row stride in elements (0 = the same row for every r).
struct Operand {
  uintptr_t ptr = 0;
  int64_t row_stride = 0;
};

template <typename S>
struct View {
  S* p;
  int64_t rs;
  explicit View(const Operand& o) : p(reinterpret_cast<S*>(o.ptr)), rs(o.row_stride) {}
  FK_HD int64_t at(int64_t r, int64_t j) const { return r * rs + j; }
};

// ---------------------------------------------------------------------------------------------
// Argument structs (what Python passes); scalars are doubles and narrowed by the functors.

struct ProxArgs {  // out = prox(x); out may alias x
  Operand x, out;
  ProxPlan plan;
};
struct BoxTensorArgs {  // out = clip(x, lo, hi) with tensor bounds (row-broadcast allowed)
  Operand x, out, lo, hi;
};
struct CvStepArgs {  // x <- x - beta * (g + c)
  Operand x, g, c;
  double beta;
};
struct NormalizedDeltaArgs {  // out = (z - x) * inv_scale; out may alias x
  Operand out, z, x;
  double inv_scale;
};
struct ControlUpdateArgs {  // c <- c + dbar - d
  Operand c, dbar, d;
};
struct ProxGradStepArgs {  // x <- prox(x - lr * g)
  Operand x, g;
  double lr;
  ProxPlan plan;
};
struct NormalMapArgs {  // z <- z - eta (g + c + (z - x)/lam); x <- prox_{lam h}(z)
  Operand z, x, g, c;
  double eta, inv_lam;
  ProxPlan plan;
};
struct Za1StepArgs {  // zhat <- zhat - eta (g + c); z <- prox(zhat)
  Operand zhat, z, g, c;
  double eta;
  ProxPlan plan;
};
struct DepositumArgs {  // m <- beta m + w y; x <- prox(x - alpha dir)
  Operand x, m, y;
  double alpha, beta, w;
  bool snag;
  ProxPlan plan;
};
struct L2BallArgs {  // x <- c + (x - c) * factor[r]; center optional
  Operand x, center;
  uintptr_t factor;  // double[rows]: min(1, radius / ||x_r - c||), filled by l2_ball_factors
  bool has_center;
};
// Reduction pass of l2_ball_: per-row chunk sums of (x - c)^2 in the fixed order of
// math/reduce.h, then one factor per row.
struct SumSqArgs {
  Operand x, center;
  uintptr_t scratch;  // double[rows * reduce_chunks(cols)]: chunk sums, row-major
  uintptr_t factor;   // double[rows]: output
  double radius;
  bool has_center;
};

// Group lasso: the groups of one call are rows or columns of one or more matrices, addressed with
// strides so that neither a column group nor a matrix inside a row of a [N, d] client stack needs a
// copy. Group g (0 <= g < n_groups) of length `len` has its element j at
//   (g / per_block) * block_stride + (g % per_block) * group_stride + j * elem_stride
// from `ptr`: rows of an [R, C] matrix are (per_block R, group_stride C, elem_stride 1), columns
// (per_block C, group_stride 1, elem_stride C); block_stride steps from one client's matrix to the
// next (d for a [N, d] stack).
struct GroupLayout {
  uintptr_t ptr = 0;
  int64_t per_block = 1, block_stride = 0, group_stride = 0, elem_stride = 1;
};
template <typename S>
struct GroupView {
  S* p;
  int64_t per_block, block_stride, group_stride, elem_stride;
  explicit GroupView(const GroupLayout& g)
      : p(reinterpret_cast<S*>(g.ptr)),
        per_block(g.per_block),
        block_stride(g.block_stride),
        group_stride(g.group_stride),
        elem_stride(g.elem_stride) {}
  FK_HD int64_t at(int64_t g, int64_t j) const {
    const int64_t b = g / per_block;
    return b * block_stride + (g - b * per_block) * group_stride + j * elem_stride;
  }
};
// Reduction pass of group_lasso_: per-group sums of x^2 (order of math/reduce.h), one factor each.
struct GroupSumSqArgs {
  GroupLayout x;
  uintptr_t scratch;  // double[n_groups * reduce_chunks(len)]
  uintptr_t factor;   // double[n_groups]: output
  double threshold;   // step * lam
};
// Scale pass of group_lasso_, in the matrices' own row-major order (contiguous for rows and
// columns alike): element (i, j) of matrix b, at b * block_stride + i * cols + j, is multiplied by
// the factor of its group, b * rows + i (rows) or b * cols + j (columns). The launch extent is
// [blocks * rows, cols].
struct GroupScaleArgs {
  uintptr_t ptr;
  int64_t rows, cols, block_stride;
  bool by_column;
  uintptr_t factor;
};

// The per-row (per-group) factor of each reduction, from the reduced sum of squares.
struct L2BallFactor {
  double radius;
  FK_HD double operator()(double sumsq) const { return l2_ball_factor(sumsq, radius); }
};
struct GroupLassoFactor {
  double threshold;
  FK_HD double operator()(double sumsq) const { return group_lasso_factor(sumsq, threshold); }
};

// ---------------------------------------------------------------------------------------------
// Functors. S = storage type, IMPL = prox formula (ignored by ops without a prox).

template <typename S, int IMPL>
struct ProxOp {
  using T = typename Acc<S>::type;
  View<const S> x;
  View<S> out;
  ProxCoef<T> k;
  explicit ProxOp(const ProxArgs& a) : x(a.x), out(a.out), k(a.plan) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    store(out.p, out.at(r, j), prox_elem<IMPL>(load(x.p, x.at(r, j)), k));
  }
};

template <typename S, int IMPL>
struct BoxTensorOp {
  using T = typename Acc<S>::type;
  View<const S> x, lo, hi;
  View<S> out;
  explicit BoxTensorOp(const BoxTensorArgs& a) : x(a.x), lo(a.lo), hi(a.hi), out(a.out) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const T v = load(x.p, x.at(r, j));
    const T l = load(lo.p, lo.at(r, j)), h = load(hi.p, hi.at(r, j));
    const T c = v > h ? h : v;
    store(out.p, out.at(r, j), v < l ? l : c);
  }
};

template <typename S, int IMPL>
struct CvStepOp {
  using T = typename Acc<S>::type;
  View<S> x;
  View<const S> g, c;
  T beta;
  explicit CvStepOp(const CvStepArgs& a) : x(a.x), g(a.g), c(a.c), beta(static_cast<T>(a.beta)) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t i = x.at(r, j);
    store(x.p, i, cv_step_elem(load(x.p, i), load(g.p, g.at(r, j)), load(c.p, c.at(r, j)), beta));
  }
};

template <typename S, int IMPL>
struct NormalizedDeltaOp {
  using T = typename Acc<S>::type;
  View<S> out;
  View<const S> z, x;
  T inv_scale;
  explicit NormalizedDeltaOp(const NormalizedDeltaArgs& a)
      : out(a.out), z(a.z), x(a.x), inv_scale(static_cast<T>(a.inv_scale)) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    store(out.p, out.at(r, j),
          normalized_delta_elem(load(z.p, z.at(r, j)), load(x.p, x.at(r, j)), inv_scale));
  }
};

template <typename S, int IMPL>
struct ControlUpdateOp {
  using T = typename Acc<S>::type;
  View<S> c;
  View<const S> dbar, d;
  explicit ControlUpdateOp(const ControlUpdateArgs& a) : c(a.c), dbar(a.dbar), d(a.d) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t i = c.at(r, j);
    store(c.p, i,
          control_update_elem(load(c.p, i), load(dbar.p, dbar.at(r, j)), load(d.p, d.at(r, j))));
  }
};

template <typename S, int IMPL>
struct ProxGradStepOp {
  using T = typename Acc<S>::type;
  View<S> x;
  View<const S> g;
  T lr;
  ProxCoef<T> k;
  explicit ProxGradStepOp(const ProxGradStepArgs& a)
      : x(a.x), g(a.g), lr(static_cast<T>(a.lr)), k(a.plan) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t i = x.at(r, j);
    store(x.p, i, prox_grad_elem<IMPL>(load(x.p, i), load(g.p, g.at(r, j)), lr, k));
  }
};

template <typename S, int IMPL>
struct NormalMapOp {
  using T = typename Acc<S>::type;
  View<S> z, x;
  View<const S> g, c;
  T eta, inv_lam;
  ProxCoef<T> k;
  explicit NormalMapOp(const NormalMapArgs& a)
      : z(a.z),
        x(a.x),
        g(a.g),
        c(a.c),
        eta(static_cast<T>(a.eta)),
        inv_lam(static_cast<T>(a.inv_lam)),
        k(a.plan) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t iz = z.at(r, j), ix = x.at(r, j);
    const auto res = normal_map_elem<IMPL>(load(z.p, iz), load(x.p, ix), load(g.p, g.at(r, j)),
                                           load(c.p, c.at(r, j)), eta, inv_lam, k);
    store(z.p, iz, res.z);
    store(x.p, ix, res.x);
  }
};

template <typename S, int IMPL>
struct Za1StepOp {
  using T = typename Acc<S>::type;
  View<S> zhat, z;
  View<const S> g, c;
  T eta;
  ProxCoef<T> k;
  explicit Za1StepOp(const Za1StepArgs& a)
      : zhat(a.zhat), z(a.z), g(a.g), c(a.c), eta(static_cast<T>(a.eta)), k(a.plan) {}
  FK_HD void operator()(int64_t r, int64_t j) const { apply(r, j, z.p, z.at(r, j)); }
  // The body with element (r, j) of z at zout[iz]: the CPU backend writes a block of z to a small
  // buffer first and streams it to memory from there (csrc/cpu/kernels.cpp, cpu_for_each_streamed).
  FK_HD void apply(int64_t r, int64_t j, S* zout, int64_t iz) const {
    const int64_t ih = zhat.at(r, j);
    const T pre = cv_step_elem(load(zhat.p, ih), load(g.p, g.at(r, j)), load(c.p, c.at(r, j)), eta);
    store(zhat.p, ih, pre);
    store(zout, iz, prox_elem<IMPL>(pre, k));
  }
};

template <typename S, int IMPL>
struct DepositumOp {
  using T = typename Acc<S>::type;
  View<S> x, m;
  View<const S> y;
  T alpha, beta, w;
  bool snag;
  ProxCoef<T> k;
  explicit DepositumOp(const DepositumArgs& a)
      : x(a.x),
        m(a.m),
        y(a.y),
        alpha(static_cast<T>(a.alpha)),
        beta(static_cast<T>(a.beta)),
        w(static_cast<T>(a.w)),
        snag(a.snag),
        k(a.plan) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t ix = x.at(r, j), im = m.at(r, j);
    const auto res = depositum_elem<IMPL>(load(x.p, ix), load(m.p, im), load(y.p, y.at(r, j)),
                                          alpha, beta, w, snag, k);
    store(m.p, im, res.m);
    store(x.p, ix, res.x);
  }
};

template <typename S, int IMPL>
struct L2BallOp {
  using T = typename Acc<S>::type;
  View<S> x;
  View<const S> center;
  const double* factors;
  bool has_center;
  explicit L2BallOp(const L2BallArgs& a)
      : x(a.x),
        center(a.center),
        factors(reinterpret_cast<const double*>(a.factor)),
        has_center(a.has_center) {}
  FK_HD void operator()(int64_t r, int64_t j) const {
    const int64_t i = x.at(r, j);
    const T factor = static_cast<T>(factors[r]);
    const T c = has_center ? load(center.p, center.at(r, j)) : T(0);
    store(x.p, i, l2_ball_elem(load(x.p, i), c, factor));
  }
};

// Reduction body: squared distance of one element to the center, in double.
template <typename S>
struct SumSqTerm {
  View<const S> x, center;
  bool has_center;
  explicit SumSqTerm(const SumSqArgs& a) : x(a.x), center(a.center), has_center(a.has_center) {}
  FK_HD double operator()(int64_t r, int64_t j) const {
    const double v = static_cast<double>(load(x.p, x.at(r, j)));
    const double c = has_center ? static_cast<double>(load(center.p, center.at(r, j))) : 0.0;
    return (v - c) * (v - c);
  }
};

template <typename S, int IMPL>
struct GroupScaleOp {
  using T = typename Acc<S>::type;
  S* p;
  int64_t rows, cols, block_stride;
  bool by_column;
  const double* factors;
  explicit GroupScaleOp(const GroupScaleArgs& a)
      : p(reinterpret_cast<S*>(a.ptr)),
        rows(a.rows),
        cols(a.cols),
        block_stride(a.block_stride),
        by_column(a.by_column),
        factors(reinterpret_cast<const double*>(a.factor)) {}
  FK_HD void operator()(int64_t r, int64_t j) const {  // r = b * rows + i
    const int64_t b = r / rows;
    const int64_t idx = b * block_stride + (r - b * rows) * cols + j;
    const int64_t g = by_column ? b * cols + j : r;
    store(p, idx, load(p, idx) * static_cast<T>(factors[g]));
  }
};

// Reduction body of group_lasso_: the square of one group element, in double.
template <typename S>
struct GroupSumSqTerm {
  GroupView<const S> x;
  explicit GroupSumSqTerm(const GroupSumSqArgs& a) : x(a.x) {}
  FK_HD double operator()(int64_t g, int64_t j) const {
    const double v = static_cast<double>(load(x.p, x.at(g, j)));
    return v * v;
  }
};

// ---------------------------------------------------------------------------------------------
// The op table: X(name, Args, Functor, uses_prox_plan). Each backend expands it once to define
// `void <name>_<backend>(const Launch&, const Args&)`, and the bindings expand it again. It is
// split in three so the CUDA backend compiles them as three translation units, in parallel.
#define FK_PROX_OPS(X)                          \
  X(prox, ProxArgs, ProxOp, true)               \
  X(prox_grad_step, ProxGradStepArgs, ProxGradStepOp, true)
#define FK_FUSED_PROX_OPS(X)                                \
  X(normal_map_step, NormalMapArgs, NormalMapOp, true)      \
  X(za1_step, Za1StepArgs, Za1StepOp, true)                 \
  X(depositum_step, DepositumArgs, DepositumOp, true)
#define FK_PLAIN_OPS(X)                                                \
  X(box_tensor, BoxTensorArgs, BoxTensorOp, false)                     \
  X(cv_step, CvStepArgs, CvStepOp, false)                              \
  X(normalized_delta, NormalizedDeltaArgs, NormalizedDeltaOp, false)   \
  X(control_update, ControlUpdateArgs, ControlUpdateOp, false)         \
  X(l2_ball_scale, L2BallArgs, L2BallOp, false)                       \
  X(group_scale, GroupScaleArgs, GroupScaleOp, false)
#define FK_ELEMENTWISE_OPS(X) FK_PROX_OPS(X) FK_FUSED_PROX_OPS(X) FK_PLAIN_OPS(X)

}  // namespace fk
