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

constexpr int64_t kBlock = kCudaBlock;
constexpr int64_t kMaxGridX = kCudaMaxGridX;
constexpr int64_t kMaxGridY = kCudaMaxGridY;

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("fedkernels CUDA error in ") + what + ": " +
                             cudaGetErrorString(err));
}

// Whether `device` already has an active primary context (cuDevicePrimaryCtxGetState, reached
// through the runtime so the extension need not link libcuda). If the driver cannot be asked,
// assume it has one (the behaviour before this check existed).
inline bool has_primary_context(int device) {
  using GetState = int (*)(int, unsigned int*, int*);  // CUresult (CUdevice, flags, active)
  static const GetState get_state = []() -> GetState {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return true;
  unsigned int flags = 0;
  int active = 0;
  if (get_state(device, &flags, &active) != 0) return true;
  return active != 0;
}

// Makes `device` current for a launch, as torch's CUDAGuard does: it switches only when another
// device is current, and switches back only to a device that already has a context. A thread
// with no current context reports device 0; restoring it unconditionally would create a context
// (hundreds of MiB) on GPU 0 in every process that only ever used GPU 1.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    int current = -1;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current == device) return;
    check(cudaSetDevice(device), "cudaSetDevice");
    prev_ = current;
  }
  ~DeviceGuard() {
    if (prev_ >= 0 && has_primary_context(prev_)) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;  // the device to restore; -1 = nothing was switched
};

inline __device__ Dim3 dim3_of(const uint3& v) { return Dim3{v.x, v.y, v.z}; }
inline __device__ Dim3 dim3_of(const dim3& v) { return Dim3{v.x, v.y, v.z}; }

template <class Op>
__global__ void elementwise_kernel(Op op, int64_t rows, int64_t cols, bool flat) {
  elementwise_thread_body(op, rows, cols, flat, dim3_of(blockIdx), dim3_of(blockDim),
                          dim3_of(threadIdx), dim3_of(gridDim));
}

// Chunk sums of the l2_ball_ reduction, in the order of math/reduce.h: one block per (chunk, row),
// the lane tree in shared memory, one plain store per chunk (no atomics: the order is fixed).
template <class Term>
__global__ void reduce_chunks_kernel(Term term, int64_t rows, int64_t cols, double* scratch) {
  __shared__ double lanes[kReduceLanes];
  const int64_t chunks = reduce_chunks(cols);
  const int64_t t = threadIdx.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t k = blockIdx.x; k < chunks; k += gridDim.x) {
      lanes[t] = reduce_lane_sum(term, r, k, t, cols);
      __syncthreads();
      for (int64_t s = kReduceLanes / 2; s > 0; s >>= 1) {
        if (t < s) reduce_tree_step(lanes, t, s);
        __syncthreads();
      }
      if (t == 0) scratch[r * chunks + k] = lanes[0];
      __syncthreads();
    }
  }
}

// One thread per row: add the row's chunk sums in order and compute its factor once.
__global__ void l2_ball_factor_kernel(const double* scratch, int64_t rows, int64_t chunks,
                                      double radius, double* factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
    factor[r] = l2_ball_factor(reduce_row_total(scratch + r * chunks, chunks), radius);
}

struct CudaRun {
  const Launch& L;
  template <class Op>
  void operator()(const Op& op) const {
    DeviceGuard guard(L.device);
    const LaunchConfig cfg = make_launch_config(L.rows, L.cols, kMaxGridX, kMaxGridY, kBlock);
    elementwise_kernel<<<dim3(cfg.grid.x, cfg.grid.y), dim3(cfg.block.x), 0,
                         reinterpret_cast<cudaStream_t>(L.stream)>>>(op, L.rows, L.cols, cfg.flat);
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
