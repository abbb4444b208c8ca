// Gathered batched linear products on the CPU (fedkernels.raw.linear_gathered and
// linear_gathered_weight_grad): every client j multiplies by rows X[idx[j, p]] of one sample matrix,
// read in place (no gathered copy). Validation happens in Python before these run.
#pragma once

#include <cstdint>

namespace fk {

struct GatherLinearArgs {
  int dtype = 0;  // kFloat32 or kFloat64 (every float operand)
  int64_t clients = 0, outputs = 0, inputs = 0, samples = 0;  // c, o, i, P
  uintptr_t mat = 0;        // forward: W [c, o, i]; weight grad: D [c, o, P]; inner block contiguous
  int64_t mat_stride = 0;   // elements between clients of mat
  uintptr_t x = 0;          // X [n, i], contiguous
  uintptr_t idx = 0;        // int64 [c, P], contiguous, every entry in [0, n)
  uintptr_t out = 0;        // forward: [c, o, P]; weight grad: [c, o, i]; inner block contiguous
  int64_t out_stride = 0;   // elements between clients of out
};

// Dispatch to the CPU variant in use (isa_dispatch.cpp).
void linear_gathered_cpu(const GatherLinearArgs& a);
void linear_gathered_weight_grad_cpu(const GatherLinearArgs& a);

}  // namespace fk
