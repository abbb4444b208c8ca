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

#define FK_DECLARE_ISA(name, Args, Op, prox) void name(const Launch& L, const Args& a);
namespace baseline {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(sumsq, SumSqArgs, unused, false)
}  // namespace baseline
namespace avx2 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(sumsq, SumSqArgs, unused, false)
}  // namespace avx2
namespace avx512 {
FK_ELEMENTWISE_OPS(FK_DECLARE_ISA)
FK_DECLARE_ISA(sumsq, SumSqArgs, unused, false)
}  // namespace avx512
#undef FK_DECLARE_ISA

}  // namespace fk
