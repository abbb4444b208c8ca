// The per-thread bodies of the CUDA kernels, written as __host__ __device__ functions of explicit
// thread coordinates. The __global__ kernels in kernels.cu only forward blockIdx/threadIdx here, so
// the host emulation in emulate.cpp runs exactly this code (tests/test_cuda_emulation.py): without
// a GPU in CI, that is how the device indexing and bodies are exercised.
#pragma once

#include <cstdint>

#include "../math/common.h"

namespace fk {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid, block;
};

// Columns map to grid.x * block.x threads, rows to grid.y; both are grid-stride loops, so any grid
// covers any [rows, cols] (cols and rows*cols may exceed 2^31: indices are int64).
inline LaunchConfig make_launch_config(int64_t rows, int64_t cols, int64_t max_grid_x,
                                       int64_t max_grid_y, int64_t block) {
  LaunchConfig cfg;
  cfg.block.x = static_cast<uint32_t>(block);
  int64_t gx = (cols + block - 1) / block;
  gx = gx < 1 ? 1 : (gx > max_grid_x ? max_grid_x : gx);
  int64_t gy = rows < 1 ? 1 : (rows > max_grid_y ? max_grid_y : rows);
  cfg.grid.x = static_cast<uint32_t>(gx);
  cfg.grid.y = static_cast<uint32_t>(gy);
  return cfg;
}

template <class Op>
FK_HD void elementwise_thread_body(const Op& op, int64_t rows, int64_t cols, Dim3 block_idx,
                                   Dim3 block_dim, Dim3 thread_idx, Dim3 grid_dim) {
  const int64_t col_start = static_cast<int64_t>(block_idx.x) * block_dim.x + thread_idx.x;
  const int64_t col_step = static_cast<int64_t>(grid_dim.x) * block_dim.x;
  for (int64_t r = block_idx.y; r < rows; r += grid_dim.y) {
    for (int64_t j = col_start; j < cols; j += col_step) op(r, j);
  }
}

// One thread's partial sum of a row reduction (the block then reduces the partials).
template <class Term>
FK_HD double reduction_thread_partial(const Term& term, int64_t r, int64_t cols, Dim3 block_idx,
                                      Dim3 block_dim, Dim3 thread_idx, Dim3 grid_dim) {
  const int64_t col_start = static_cast<int64_t>(block_idx.x) * block_dim.x + thread_idx.x;
  const int64_t col_step = static_cast<int64_t>(grid_dim.x) * block_dim.x;
  double acc = 0.0;
  for (int64_t j = col_start; j < cols; j += col_step) acc += term(r, j);
  return acc;
}

}  // namespace fk
