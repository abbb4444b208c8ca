// CUDA kernels for the ops without a prox, the row reduction, and runtime queries.
#include <string>

#include "launch.cuh"

#ifndef FK_CUDA_ARCHS
#define FK_CUDA_ARCHS "unknown"
#endif

namespace fk {

FK_PLAIN_OPS(FK_DEFINE_CUDA)

using namespace cuda_detail;

void l2_ball_factors_cuda(const Launch& L, const SumSqArgs& a) {
  if (L.rows == 0) return;
  DeviceGuard guard(L.device);
  auto stream = reinterpret_cast<cudaStream_t>(L.stream);
  auto* scratch = reinterpret_cast<double*>(a.scratch);
  const int64_t chunks = reduce_chunks(L.cols);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (chunks > 0) {
      const LaunchConfig cfg = make_reduce_config(L.rows, L.cols, kMaxGridX, kMaxGridY);
      reduce_chunks_kernel<<<dim3(cfg.grid.x, cfg.grid.y), dim3(cfg.block.x), 0, stream>>>(
          SumSqTerm<S>(a), L.rows, L.cols, scratch);
      check(cudaGetLastError(), "l2_ball reduction launch");
    }
  });
  int64_t blocks = (L.rows + kBlock - 1) / kBlock;
  blocks = blocks > kMaxGridX ? kMaxGridX : blocks;
  l2_ball_factor_kernel<<<dim3(static_cast<uint32_t>(blocks)), dim3(kBlock), 0, stream>>>(
      scratch, L.rows, chunks, a.radius, reinterpret_cast<double*>(a.factor));
  check(cudaGetLastError(), "l2_ball factor launch");
}

bool cuda_compiled() { return true; }
std::string cuda_archs() { return FK_CUDA_ARCHS; }

// Initializes the CUDA driver in this process: a process that forks afterwards cannot use CUDA in
// its children. Python calls it only once torch has initialized CUDA itself.
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

// The toolkit the extension was built with (static runtime): a compile-time constant, so asking
// initializes nothing (backend_info must not touch the driver; see cuda_device_count).
std::string cuda_runtime_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string((CUDART_VERSION % 1000) / 10);
}

}  // namespace fk
