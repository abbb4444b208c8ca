// Host emulation of the CUDA launches: every (block, thread) of a deliberately small grid runs the
// same thread body as the device (launch_body.h), serially, on host memory. Built in every
// configuration, CUDA or not; used only by tests.
#include "../dispatch.h"
#include "launch_body.h"

namespace fk {
namespace {

template <class Op>
void emulate_elementwise(const Op& op, const Launch& L, const EmulationConfig& e) {
  const LaunchConfig cfg = make_launch_config(L.rows, L.cols, e.max_grid_x, e.max_grid_y, e.block);
  Dim3 b, t;
  for (b.y = 0; b.y < cfg.grid.y; ++b.y)
    for (b.x = 0; b.x < cfg.grid.x; ++b.x)
      for (t.x = 0; t.x < cfg.block.x; ++t.x)
        elementwise_thread_body(op, L.rows, L.cols, cfg.flat, b, cfg.block, t, cfg.grid);
}

struct EmulatedRun {
  const Launch& L;
  const EmulationConfig& e;
  template <class Op>
  void operator()(const Op& op) const {
    emulate_elementwise(op, L, e);
  }
};

}  // namespace

#define FK_DEFINE_EMULATED(name, Args, Op, prox)                                       \
  void name##_cuda_emulated(const Launch& L, const Args& a, const EmulationConfig& e) { \
    if (L.rows * L.cols == 0) return;                                                  \
    dispatch_op<Op, prox>(L, a, EmulatedRun{L, e});                                   \
  }
FK_ELEMENTWISE_OPS(FK_DEFINE_EMULATED)
#undef FK_DEFINE_EMULATED

namespace {

// Mirrors reduce_chunks_kernel and row_factor_kernel: every block of a small grid (rows and
// chunks grid-stride as on the device) runs its 256 lanes, then the same lane tree, level by level.
template <template <typename> class Term, class Args, class Factor>
void emulate_row_factors(const Launch& L, const Args& a, const EmulationConfig& e, const Factor& factor_of) {
  auto* scratch = reinterpret_cast<double*>(a.scratch);
  auto* factor = reinterpret_cast<double*>(a.factor);
  const int64_t chunks = reduce_chunks(L.cols);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const Term<S> term(a);
    const LaunchConfig cfg = make_reduce_config(L.rows, L.cols, e.max_grid_x, e.max_grid_y);
    double lanes[kReduceLanes];
    for (int64_t by = 0; by < cfg.grid.y; ++by)
      for (int64_t bx = 0; bx < cfg.grid.x; ++bx)
        for (int64_t r = by; r < L.rows; r += cfg.grid.y)
          for (int64_t k = bx; k < chunks; k += cfg.grid.x) {
            for (int64_t t = 0; t < kReduceLanes; ++t) lanes[t] = reduce_lane_sum(term, r, k, t, L.cols);
            for (int64_t s = kReduceLanes / 2; s > 0; s >>= 1)
              for (int64_t t = 0; t < s; ++t) reduce_tree_step(lanes, t, s);
            scratch[r * chunks + k] = lanes[0];
          }
  });
  for (int64_t r = 0; r < L.rows; ++r) factor[r] = factor_of(reduce_row_total(scratch + r * chunks, chunks));
}

}  // namespace

void l2_ball_factors_cuda_emulated(const Launch& L, const SumSqArgs& a, const EmulationConfig& e) {
  emulate_row_factors<SumSqTerm>(L, a, e, L2BallFactor{a.radius});
}

void group_lasso_factors_cuda_emulated(const Launch& L, const GroupSumSqArgs& a, const EmulationConfig& e) {
  emulate_row_factors<GroupSumSqTerm>(L, a, e, GroupLassoFactor{a.threshold});
}

}  // namespace fk
