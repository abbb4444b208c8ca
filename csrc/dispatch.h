// Host-side dispatch shared by every backend: storage dtype and prox formula become template
// arguments here, once per call, so kernels see neither (STYLE.md §3.4-3.5). Dtype combinations are
// explicit and few: every buffer of one call has the same dtype.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ops.h"

namespace fk {

// What one call runs on: its dtype, its [rows, cols] extent and (CUDA) its device and stream.
struct Launch {
  int dtype = kFloat32;
  int device = -1;       // CUDA device index; -1 on CPU
  uintptr_t stream = 0;  // cudaStream_t of the current torch stream
  int64_t rows = 1;
  int64_t cols = 0;
};

// Grid limits for the host emulation of a CUDA launch: deliberately tiny grids, so that every
// grid-stride loop in the device code takes several trips.
struct EmulationConfig {
  int64_t max_grid_x = 3;
  int64_t max_grid_y = 2;
  int64_t block = 32;
};

template <typename S>
struct TypeTag {
  using type = S;
};

template <typename F>
void dispatch_dtype(int dtype, F&& f) {
  switch (dtype) {
    case kFloat32: f(TypeTag<float>{}); break;
    case kFloat64: f(TypeTag<double>{}); break;
    case kFloat16: f(TypeTag<half_t>{}); break;
    case kBFloat16: f(TypeTag<bfloat16_t>{}); break;
    default: throw std::invalid_argument("fedkernels: unsupported dtype code " + std::to_string(dtype));
  }
}

template <typename F>
void dispatch_impl(int impl, F&& f) {
  switch (impl) {
    case kIdentity: f(std::integral_constant<int, kIdentity>{}); break;
    case kSoftThreshold: f(std::integral_constant<int, kSoftThreshold>{}); break;
    case kElasticNet: f(std::integral_constant<int, kElasticNet>{}); break;
    case kMcpFirm: f(std::integral_constant<int, kMcpFirm>{}); break;
    case kMcpHard: f(std::integral_constant<int, kMcpHard>{}); break;
    case kScadSmall: f(std::integral_constant<int, kScadSmall>{}); break;
    case kScadSmallEdge: f(std::integral_constant<int, kScadSmallEdge>{}); break;
    case kScadLarge: f(std::integral_constant<int, kScadLarge>{}); break;
    case kClip: f(std::integral_constant<int, kClip>{}); break;
    case kNonNeg: f(std::integral_constant<int, kNonNeg>{}); break;
    default: throw std::invalid_argument("fedkernels: unknown prox formula " + std::to_string(impl));
  }
}

template <typename Args>
int plan_impl(const Args& a, std::true_type) {
  return a.plan.impl;
}
template <typename Args>
int plan_impl(const Args&, std::false_type) {
  return kIdentity;
}

// Build Op<S, IMPL> for this call and hand it to `run` (a backend's loop or launcher).
template <template <typename, int> class Op, bool PROX, typename Args, typename Run>
void dispatch_op(const Launch& L, const Args& a, Run&& run) {
  const int impl = plan_impl(a, std::integral_constant<bool, PROX>{});
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (PROX) {
      dispatch_impl(impl, [&](auto k) { run(Op<S, impl_for<S>(decltype(k)::value)>(a)); });
    } else {
      run(Op<S, kIdentity>(a));
    }
  });
}

// Backend entry points, one per op in FK_ELEMENTWISE_OPS plus the row reductions of l2_ball_ and
// group_lasso_.
#define FK_DECLARE_BACKENDS(name, Args, Op, prox)                                     \
  void name##_cpu(const Launch& L, const Args& a);                                    \
  void name##_cuda(const Launch& L, const Args& a);                                   \
  void name##_cuda_emulated(const Launch& L, const Args& a, const EmulationConfig& e);
FK_ELEMENTWISE_OPS(FK_DECLARE_BACKENDS)
FK_DECLARE_BACKENDS(l2_ball_factors, SumSqArgs, unused, false)
FK_DECLARE_BACKENDS(group_lasso_factors, GroupSumSqArgs, unused, false)
#undef FK_DECLARE_BACKENDS

// CPU threading (fedkernels.set_num_threads); defaults to OpenMP's own default.
void cpu_set_num_threads(int n);
int cpu_get_num_threads();
int cpu_thread_limit();  // OpenMP's thread-limit-var (OMP_THREAD_LIMIT); fedkernels.set_num_threads caps at it
std::string cpu_simd_description();
// The CPU kernel variant in use, the variants this CPU can run, and a test hook forcing one.
std::string cpu_isa();
std::string cpu_isa_source();  // "detected", "FEDKERNELS_CPU_ISA", "set_cpu_isa" or the calibration's source
std::string cpu_isa_variants();
void cpu_set_isa(const std::string& name);
// The elementwise families' variants chosen by calibration ("auto": none): `name` for those with a
// prox formula (cpu_isa), `plain` for the plain updates and row reductions (cpu_plain_isa); and
// the gathered linear kernels' variant (never calibrated: not bitwise equal across variants).
void cpu_choose_elementwise_isa(const std::string& name, const std::string& plain, const std::string& source);
std::string cpu_plain_isa();
std::string cpu_gather_isa();

// CUDA runtime facts; every function works in a CPU-only build.
bool cuda_compiled();
std::string cuda_archs();
int cuda_device_count(std::string* error);
std::string cuda_runtime_version();

}  // namespace fk
