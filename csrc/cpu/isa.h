// The CPU kernels are compiled once per instruction set into namespaces fk::<isa>; this header
// declares every variant's entry points for isa_dispatch.cpp.
#pragma once

#include "../dispatch.h"
#include "gather_linear.h"

#ifndef FK_CPU_ISA
#define FK_CPU_ISA baseline
#endif

namespace fk {

// Threads for a pass over n elements (1 below the parallel threshold).
int cpu_threads_for(int64_t n);

// Rows shorter than this are not split across threads: each thread takes whole rows.
constexpr int64_t kShortRowCols = 4096;
inline bool cpu_split_rows(int64_t rows, int64_t cols) { return rows > 1 && cols < kShortRowCols; }

// Each thread's columns start at a multiple of kShareAlign elements: at least 64 bytes for every
// storage type, so on a cache-line-aligned buffer (every torch allocation) every thread's vector
// loads and stores stay inside cache lines. OpenMP's schedule(static) splits at cols / threads
// instead, e.g. at element 5,844,756 (byte offset 16 mod 64) for an 11,689,512-element buffer on
// 2 threads: then every 64-byte AVX-512 access of the second thread straddles two cache lines
// (half of the 32-byte AVX2 ones). On the 2-core AMD EPYC (Zen 4) dev machine a buffer misaligned
// that way ran AVX-512 L1/SCAD at 84 % of the in-place probe against AVX2's 97 % (2 threads,
// fastest of 25 calls), while the hot loops execute 0.6-0.9 instructions per float in AVX-512
// against 1.4-2.3 in AVX2: the straddling, not the arithmetic, made AVX-512 the slower variant.
// (GCC ignores schedule(simd: static) here: the split is the plain one.)
constexpr int64_t kShareAlign = 64;

struct ColumnShare {
  int64_t begin, end;
};

inline ColumnShare cpu_column_share(int64_t cols, int thread, int threads) {
  const int64_t blocks = (cols + kShareAlign - 1) / kShareAlign;
  const int64_t per = blocks / threads, extra = blocks % threads;  // the first `extra` take one more
  const int64_t first = thread * per + (thread < extra ? thread : extra);
  const int64_t count = per + (thread < extra ? 1 : 0);
  const int64_t begin = first * kShareAlign, end = (first + count) * kShareAlign;
  return {begin < cols ? begin : cols, end < cols ? end : cols};
}

#define FK_DECLARE_ISA(name, Args, Op, prox) void name(const Launch& L, const Args& a);
namespace baseline {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
void linear_gathered(const GatherLinearArgs& a);
void linear_gathered_weight_grad(const GatherLinearArgs& a);
}  // namespace baseline
namespace avx2 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
void linear_gathered(const GatherLinearArgs& a);
void linear_gathered_weight_grad(const GatherLinearArgs& a);
}  // namespace avx2
namespace avx512 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
void linear_gathered(const GatherLinearArgs& a);
void linear_gathered_weight_grad(const GatherLinearArgs& a);
}  // namespace avx512
#undef FK_DECLARE_ISA

}  // namespace fk
