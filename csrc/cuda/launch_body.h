// The per-thread bodies of the CUDA kernels, written as __host__ __device__ functions of explicit
// thread coordinates. The __global__ kernels in kernels.cu only forward blockIdx/threadIdx here, so
// the host emulation in emulate.cpp runs exactly this code (tests/test_cuda_emulation.py): without
// a GPU in CI, that is how the device indexing and bodies are exercised.
#pragma once

#include <cstdint>

#include "../math/common.h"
#include "../math/reduce.h"

namespace fk {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid, block;
  bool flat = false;  // threads walk the rows*cols elements as one range (short rows)
};

// Grid limits of the real launches (the host emulation uses tiny ones instead).
constexpr int64_t kCudaBlock = 256;
constexpr int64_t kCudaMaxGridX = 1 << 16;  // grid-stride beyond this; plenty to saturate any GPU
constexpr int64_t kCudaMaxGridY = 65535;    // hardware limit for grid.y

// Rows shorter than this are not given their own blocks: a [N, 10] stack would leave 246 of each
// block's 256 threads idle. The threads walk the rows*cols elements as one range instead.
constexpr int64_t kFlatMaxCols = 4096;

// Long rows: columns map to grid.x * block.x threads, rows to grid.y. Short rows (and rows > 1):
// one flat range over grid.x * block.x threads. All loops are grid-stride, so any grid covers any
// [rows, cols] (cols and rows*cols may exceed 2^31: indices are int64).
inline LaunchConfig make_launch_config(int64_t rows, int64_t cols, int64_t max_grid_x,
                                       int64_t max_grid_y, int64_t block) {
  LaunchConfig cfg;
  cfg.block.x = static_cast<uint32_t>(block);
  cfg.flat = rows > 1 && cols < kFlatMaxCols;
  const int64_t span = cfg.flat ? rows * cols : cols;
  int64_t gx = (span + block - 1) / block;
  gx = gx < 1 ? 1 : (gx > max_grid_x ? max_grid_x : gx);
  int64_t gy = cfg.flat || rows < 1 ? 1 : (rows > max_grid_y ? max_grid_y : rows);
  cfg.grid.x = static_cast<uint32_t>(gx);
  cfg.grid.y = static_cast<uint32_t>(gy);
  return cfg;
}

template <class Op>
FK_HD void elementwise_thread_body(const Op& op, int64_t rows, int64_t cols, bool flat,
                                   Dim3 block_idx, Dim3 block_dim, Dim3 thread_idx, Dim3 grid_dim) {
  const int64_t start = static_cast<int64_t>(block_idx.x) * block_dim.x + thread_idx.x;
  const int64_t step = static_cast<int64_t>(grid_dim.x) * block_dim.x;
  if (flat) {
    const int64_t n = rows * cols;
    for (int64_t i = start; i < n; i += step) {
      const int64_t r = i / cols;
      op(r, i - r * cols);
    }
    return;
  }
  for (int64_t r = block_idx.y; r < rows; r += grid_dim.y) {
    for (int64_t j = start; j < cols; j += step) op(r, j);
  }
}

// The reduction of l2_ball_ (order: math/reduce.h): block (x, y) of a grid of kReduceLanes-thread
// blocks takes chunks k = x, x + grid.x, ... of rows r = y, y + grid.y, ...
inline LaunchConfig make_reduce_config(int64_t rows, int64_t cols, int64_t max_grid_x,
                                       int64_t max_grid_y) {
  LaunchConfig cfg;
  cfg.block.x = static_cast<uint32_t>(kReduceLanes);
  int64_t gx = reduce_chunks(cols);
  gx = gx < 1 ? 1 : (gx > max_grid_x ? max_grid_x : gx);
  int64_t gy = rows < 1 ? 1 : (rows > max_grid_y ? max_grid_y : rows);
  cfg.grid.x = static_cast<uint32_t>(gx);
  cfg.grid.y = static_cast<uint32_t>(gy);
  return cfg;
}

}  // namespace fk
