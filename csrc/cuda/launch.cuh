// CUDA backend, shared part: thin launchers around the shared thread bodies (launch_body.h) and
// functors (ops.h). Each launch runs on the caller's device and torch's current stream, is checked
// with cudaGetLastError, and never synchronizes. Included by the three kernels_*.cu files.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../dispatch.h"
#include "device_guard.h"
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
#if CUDART_VERSION >= 12000
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    // The versioned query (CUDA 12.5+; the unversioned one is deprecated there): the 12.0 ABI.
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                                       cudaEnableDefault, &found);
#else
    // Toolkits 12.0 - 12.4 have only the unversioned query (this symbol has one ABI in CUDA 12).
    cudaError_t err = cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess) fn = nullptr;
#else
    if (cudaGetDriverEntryPoint("cuDevicePrimaryCtxGetState", &fn, cudaEnableDefault) != cudaSuccess) fn = nullptr;
#endif
    if (fn == nullptr) {
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

struct CudaDeviceApi {
  int current() {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    return device;
  }
  void set(int device) { check(cudaSetDevice(device), "cudaSetDevice"); }
  void restore(int device) { cudaSetDevice(device); }
  bool has_context(int device) { return has_primary_context(device); }
};

// Makes `device` current for a launch; the rule is in device_guard.h.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : guard_(api_, device) {}

 private:
  CudaDeviceApi api_;
  BasicDeviceGuard<CudaDeviceApi> guard_;
};

inline __device__ Dim3 dim3_of(const uint3& v) { return Dim3{v.x, v.y, v.z}; }
inline __device__ Dim3 dim3_of(const dim3& v) { return Dim3{v.x, v.y, v.z}; }

template <class Op>
__global__ void elementwise_kernel(Op op, int64_t rows, int64_t cols, bool flat) {
  elementwise_thread_body(op, rows, cols, flat, dim3_of(blockIdx), dim3_of(blockDim),
                          dim3_of(threadIdx), dim3_of(gridDim));
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
