// The summation order of the row reduction behind l2_ball_ (sum_j (x - c)^2 per row), fixed by the
// constants below alone: not by the thread count, the CPU instruction set or the CUDA grid. Every
// backend (CPU, CUDA, the host emulation of CUDA) computes exactly this order, so a projection is
// bit-identical everywhere (FedCanon II relies on identical replicas).
//
//   A row is cut into chunks of kReduceChunk elements. Within chunk k, lane l (0 <= l < 256) sums
//   the elements j = k * kReduceChunk + l + i * 256, i = 0, 1, ... in increasing i, starting from 0.
//   The 256 lane sums are combined by a fixed binary tree (lane[l] += lane[l + s] for
//   s = 128, 64, ..., 1), which is what a CUDA block does in shared memory; the chunk sums are
//   then added in increasing k, starting from 0. All in double.
//
// Each lane's sum is sequential, so a CPU loop over l vectorizes without reassociating anything.
#pragma once

#include <cstdint>

#include "common.h"

namespace fk {

constexpr int64_t kReduceLanes = 256;  // also the CUDA block size of the reduction
constexpr int64_t kReducePerLane = 32;
constexpr int64_t kReduceChunk = kReduceLanes * kReducePerLane;

FK_HD int64_t reduce_chunks(int64_t cols) { return (cols + kReduceChunk - 1) / kReduceChunk; }

// Lane `lane` of chunk `k` of row `r` (one CUDA thread's share).
template <class Term>
FK_HD double reduce_lane_sum(const Term& term, int64_t r, int64_t k, int64_t lane, int64_t cols) {
  double acc = 0.0;
  const int64_t base = k * kReduceChunk + lane;
  const int64_t end = (k + 1) * kReduceChunk < cols ? (k + 1) * kReduceChunk : cols;
  for (int64_t j = base; j < end; j += kReduceLanes) acc += term(r, j);
  return acc;
}

// One level of the lane tree: lanes[t] += lanes[t + s] for every t < s.
FK_HD void reduce_tree_step(double* lanes, int64_t t, int64_t s) { lanes[t] += lanes[t + s]; }

// The chunk sums of one row, in order.
FK_HD double reduce_row_total(const double* chunk_sums, int64_t chunks) {
  double acc = 0.0;
  for (int64_t k = 0; k < chunks; ++k) acc += chunk_sums[k];
  return acc;
}

}  // namespace fk
