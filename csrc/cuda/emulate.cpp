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
        elementwise_thread_body(op, L.rows, L.cols, b, cfg.block, t, cfg.grid);
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

// Mirrors sumsq_kernel: rows on grid.y (stride), per-thread partials, then a sum per row (the
// device does the sum with a shared-memory tree and one atomicAdd per block).
void sumsq_cuda_emulated(const Launch& L, const SumSqArgs& a, const EmulationConfig& e) {
  auto* out = reinterpret_cast<double*>(a.sumsq);
  for (int64_t r = 0; r < L.rows; ++r) out[r] = 0.0;
  if (L.rows * L.cols == 0) return;
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const SumSqTerm<S> term(a);
    const LaunchConfig cfg = make_launch_config(L.rows, L.cols, e.max_grid_x, e.max_grid_y, e.block);
    Dim3 b, t;
    for (b.y = 0; b.y < cfg.grid.y; ++b.y)
      for (int64_t r = b.y; r < L.rows; r += cfg.grid.y)
        for (b.x = 0; b.x < cfg.grid.x; ++b.x)
          for (t.x = 0; t.x < cfg.block.x; ++t.x)
            out[r] += reduction_thread_partial(term, r, L.cols, b, cfg.block, t, cfg.grid);
  });
}

}  // namespace fk
