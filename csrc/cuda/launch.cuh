// CUDA backend, shared part: thin launchers around the shared thread bodies (launch_body.h) and
// functors (ops.h). Each launch runs on the caller's device and torch's current stream, is checked
// with cudaGetLastError, and never synchronizes. Included by the three kernels_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "launch_body.h"

namespace fk {
namespace cuda_detail {

constexpr int64_t kBlock = 256;
constexpr int64_t kMaxGridX = 1 << 16;  // grid-stride beyond this; plenty to saturate any GPU
constexpr int64_t kMaxGridY = 65535;    // hardware limit for grid.y

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("fedkernels CUDA error in ") + what + ": " +
                             cudaGetErrorString(err));
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (device >= 0 && device != prev_) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }

 private:
  int prev_ = 0;
};

inline __device__ Dim3 dim3_of(const uint3& v) { return Dim3{v.x, v.y, v.z}; }
inline __device__ Dim3 dim3_of(const dim3& v) { return Dim3{v.x, v.y, v.z}; }

template <class Op>
__global__ void elementwise_kernel(Op op, int64_t rows, int64_t cols) {
  elementwise_thread_body(op, rows, cols, dim3_of(blockIdx), dim3_of(blockDim), dim3_of(threadIdx),
                          dim3_of(gridDim));
}

template <class Term>
__global__ void sumsq_kernel(Term term, int64_t rows, int64_t cols, double* out) {
  __shared__ double partial[kBlock];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    partial[threadIdx.x] = reduction_thread_partial(term, r, cols, dim3_of(blockIdx),
                                                    dim3_of(blockDim), dim3_of(threadIdx),
                                                    dim3_of(gridDim));
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(&out[r], partial[0]);
    __syncthreads();
  }
}

struct CudaRun {
  const Launch& L;
  template <class Op>
  void operator()(const Op& op) const {
    DeviceGuard guard(L.device);
    const LaunchConfig cfg = make_launch_config(L.rows, L.cols, kMaxGridX, kMaxGridY, kBlock);
    elementwise_kernel<<<dim3(cfg.grid.x, cfg.grid.y), dim3(cfg.block.x), 0,
                         reinterpret_cast<cudaStream_t>(L.stream)>>>(op, L.rows, L.cols);
    check(cudaGetLastError(), "kernel launch");
  }
};

}  // namespace cuda_detail

#define FK_DEFINE_CUDA(name, Args, Op, prox)           \
  void name##_cuda(const Launch& L, const Args& a) {   \
    if (L.rows * L.cols == 0) return;                  \
    dispatch_op<Op, prox>(L, a, cuda_detail::CudaRun{L}); \
  }

}  // namespace fk
