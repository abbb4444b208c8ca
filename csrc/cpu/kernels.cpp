// CPU backend: OpenMP loops over [rows, cols] blocks that call the shared per-element functors.
// Every op is one pass over memory. The inner loop is an `omp simd` loop over contiguous columns;
// the functors are branch-free (selects), so GCC vectorizes them (check with -fopt-info-vec).
//
// This file is compiled once per instruction set (FK_CPU_ISA = baseline, avx2, ...; see
// CMakeLists.txt) and isa_dispatch.cpp picks the best variant the running CPU supports: with
// SSE2 only, SCAD's longer select chain is compute-bound, with AVX2 every prox runs at the
// memory roofline.
#include <omp.h>

#include "../dispatch.h"
#include "isa.h"

namespace fk {
namespace FK_CPU_ISA {
namespace {

int threads_for(int64_t n) { return cpu_threads_for(n); }

template <class Op>
void cpu_for_each(const Op& op, int64_t rows, int64_t cols) {
  const int nt = threads_for(rows * cols);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const Op local = op;  // a private copy: its scalars cannot alias the buffers being written
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp for simd schedule(static) nowait
      for (int64_t j = 0; j < cols; ++j) local(r, j);
    }
  }
}

struct CpuRun {
  const Launch& L;
  template <class Op>
  void operator()(const Op& op) const {
    cpu_for_each(op, L.rows, L.cols);
  }
};

}  // namespace

#define FK_DEFINE_CPU(name, Args, Op, prox)              \
  void name(const Launch& L, const Args& a) {            \
    if (L.rows * L.cols == 0) return;                    \
    dispatch_op<Op, prox>(L, a, CpuRun{L});              \
  }
FK_ELEMENTWISE_OPS(FK_DEFINE_CPU)
#undef FK_DEFINE_CPU

void sumsq(const Launch& L, const SumSqArgs& a) {
  auto* out = reinterpret_cast<double*>(a.sumsq);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const SumSqTerm<S> term(a);
    const int nt = threads_for(L.cols);
    for (int64_t r = 0; r < L.rows; ++r) {
      double acc = 0.0;
#pragma omp parallel for simd num_threads(nt) if (nt > 1) schedule(static) reduction(+ : acc)
      for (int64_t j = 0; j < L.cols; ++j) acc += term(r, j);
      out[r] = acc;
    }
  });
}

}  // namespace FK_CPU_ISA
}  // namespace fk
