// CUDA kernels for the ops without a prox, the row reductions, and runtime queries.
#include <string>

#include "launch.cuh"

#ifndef FK_CUDA_ARCHS
#define FK_CUDA_ARCHS "unknown"
#endif

namespace fk {

FK_PLAIN_OPS(FK_DEFINE_CUDA)

using namespace cuda_detail;

namespace {

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
template <class Factor>
__global__ void row_factor_kernel(const double* scratch, int64_t rows, int64_t chunks, Factor factor_of,
                                  double* factor) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
    factor[r] = factor_of(reduce_row_total(scratch + r * chunks, chunks));
}

// The two launches of a row reduction (chunk sums, then one factor per row), on one stream.
template <template <typename> class Term, class Args, class Factor>
void row_factors_cuda(const Launch& L, const Args& a, const Factor& factor_of, const char* what) {
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
          Term<S>(a), L.rows, L.cols, scratch);
      check(cudaGetLastError(), what);
    }
  });
  int64_t blocks = (L.rows + kBlock - 1) / kBlock;
  blocks = blocks > kMaxGridX ? kMaxGridX : blocks;
  row_factor_kernel<<<dim3(static_cast<uint32_t>(blocks)), dim3(kBlock), 0, stream>>>(
      scratch, L.rows, chunks, factor_of, reinterpret_cast<double*>(a.factor));
  check(cudaGetLastError(), what);
}

}  // namespace

void l2_ball_factors_cuda(const Launch& L, const SumSqArgs& a) {
  row_factors_cuda<SumSqTerm>(L, a, L2BallFactor{a.radius}, "l2_ball reduction launch");
}

void group_lasso_factors_cuda(const Launch& L, const GroupSumSqArgs& a) {
  row_factors_cuda<GroupSumSqTerm>(L, a, GroupLassoFactor{a.threshold}, "group_lasso reduction launch");
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
