// The CPU kernels are compiled once per instruction set into namespaces fk::<isa>; this header
// declares every variant's entry points for isa_dispatch.cpp.
#pragma once

#include "../dispatch.h"

#ifndef FK_CPU_ISA
#define FK_CPU_ISA baseline
#endif

namespace fk {

// Threads for a pass over n elements (1 below the parallel threshold).
int cpu_threads_for(int64_t n);

// Rows shorter than this are not split across threads: each thread takes whole rows.
constexpr int64_t kShortRowCols = 4096;
inline bool cpu_split_rows(int64_t rows, int64_t cols) { return rows > 1 && cols < kShortRowCols; }

#define FK_DECLARE_ISA(name, Args, Op, prox) void name(const Launch& L, const Args& a);
namespace baseline {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
}  // namespace baseline
namespace avx2 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
}  // namespace avx2
namespace avx512 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_ISA(group_lasso_factors, GroupSumSqArgs, unused, false)
}  // namespace avx512
#undef FK_DECLARE_ISA

}  // namespace fk
