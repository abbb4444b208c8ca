// CUDA kernels for the ops without a prox, the row reduction, and runtime queries.
#include <string>

#include "launch.cuh"

#ifndef FK_CUDA_ARCHS
#define FK_CUDA_ARCHS "unknown"
#endif

namespace fk {

FK_PLAIN_OPS(FK_DEFINE_CUDA)

using namespace cuda_detail;

void sumsq_cuda(const Launch& L, const SumSqArgs& a) {
  if (L.rows == 0) return;
  DeviceGuard guard(L.device);
  auto stream = reinterpret_cast<cudaStream_t>(L.stream);
  auto* out = reinterpret_cast<double*>(a.sumsq);
  check(cudaMemsetAsync(out, 0, sizeof(double) * L.rows, stream), "cudaMemsetAsync");
  if (L.cols == 0) return;
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const LaunchConfig cfg = make_launch_config(L.rows, L.cols, kMaxGridX, kMaxGridY, kBlock);
    sumsq_kernel<<<dim3(cfg.grid.x, cfg.grid.y), dim3(cfg.block.x), 0, stream>>>(
        SumSqTerm<S>(a), L.rows, L.cols, out);
    check(cudaGetLastError(), "sumsq launch");
  });
}

bool cuda_compiled() { return true; }
std::string cuda_archs() { return FK_CUDA_ARCHS; }

int cuda_device_count(std::string* error) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (error) *error = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

std::string cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace fk
