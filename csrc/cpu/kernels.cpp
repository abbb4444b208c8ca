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
  if (cpu_split_rows(rows, cols)) {
    // Short rows ([N, small d] stacks): whole rows per thread. Splitting a 10-element row across
    // threads costs a work-sharing construct per row and puts neighbours on one cache line.
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const Op local = op;  // a private copy: its scalars cannot alias the buffers being written
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
        for (int64_t j = 0; j < cols; ++j) local(r, j);
      }
    }
    return;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const Op local = op;  // a private copy: its scalars cannot alias the buffers being written
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp for simd schedule(static) nowait
      for (int64_t j = 0; j < cols; ++j) local(r, j);
    }
  }
}

// One chunk's sum in the order of math/reduce.h: the 256 lanes side by side (the loop over lanes
// vectorizes, and each lane still adds its elements in sequence), then the lane tree.
template <class Term>
double chunk_sum(const Term& term, int64_t r, int64_t k, int64_t cols) {
  alignas(64) double lanes[kReduceLanes];
  for (int64_t l = 0; l < kReduceLanes; ++l) lanes[l] = 0.0;
  const int64_t end = (k + 1) * kReduceChunk < cols ? (k + 1) * kReduceChunk : cols;
  for (int64_t base = k * kReduceChunk; base < end; base += kReduceLanes) {
    const int64_t n = end - base < kReduceLanes ? end - base : kReduceLanes;
#pragma omp simd
    for (int64_t l = 0; l < n; ++l) lanes[l] += term(r, base + l);
  }
  for (int64_t s = kReduceLanes / 2; s > 0; s >>= 1) {
#pragma omp simd
    for (int64_t t = 0; t < s; ++t) reduce_tree_step(lanes, t, s);
  }
  return lanes[0];
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

// Chunk sums of every row in parallel over (row, chunk) pairs, then one factor per row: the result
// does not depend on the thread count (each chunk sum is computed whole by one thread).
void l2_ball_factors(const Launch& L, const SumSqArgs& a) {
  auto* scratch = reinterpret_cast<double*>(a.scratch);
  auto* factor = reinterpret_cast<double*>(a.factor);
  const int64_t chunks = reduce_chunks(L.cols);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const SumSqTerm<S> term(a);
    const int64_t pairs = L.rows * chunks;
    const int nt = threads_for(L.rows * L.cols);
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t p = 0; p < pairs; ++p) scratch[p] = chunk_sum(term, p / chunks, p % chunks, L.cols);
  });
  for (int64_t r = 0; r < L.rows; ++r)
    factor[r] = l2_ball_factor(reduce_row_total(scratch + r * chunks, chunks), a.radius);
}

}  // namespace FK_CPU_ISA
}  // namespace fk
