// CPU backend: OpenMP loops over [rows, cols] blocks that call the shared per-element functors.
// Every op is one pass over memory. The inner loop is an `omp simd` loop over contiguous columns;
// the functors are branch-free (selects), so GCC vectorizes them (check with -fopt-info-vec).
//
// This file is compiled once per instruction set (FK_CPU_ISA = baseline, avx2, ...; see
// CMakeLists.txt) and isa_dispatch.cpp picks the best variant the running CPU supports: with
// SSE2 only, SCAD's longer select chain is compute-bound, with AVX2 every prox runs at the
// memory roofline.
#include <omp.h>

#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../dispatch.h"
#include "fp_env.h"
#include "isa.h"
#if defined(__AVX512DQ__)
#include "lanes_avx512.h"
#endif

namespace fk {
namespace FK_CPU_ISA {
namespace {

int threads_for(int64_t n) { return cpu_threads_for(n); }

// An output the op writes without reading it (za1_step's z). A plain store to a line that is not
// in the cache first reads it from memory (read-for-ownership): za1_step then moves 6 values per
// element (zhat, g, c, z read; zhat, z written) for the 5 it needs. Non-temporal stores write
// whole lines without that read, but they also take the line out of the cache, so they are only
// used where z could not stay there anyway: z alone at least kStreamMinBytes (the call then moves
// at least four times that, twice the 32 MiB L3 of the dev machine).
template <class Op>
struct StreamedOutput : std::false_type {};
template <typename S, int IMPL>
struct StreamedOutput<Za1StepOp<S, IMPL>> : std::true_type {};

constexpr int64_t kStreamMinBytes = int64_t(16) << 20;
// Elements computed into an L1-resident buffer before they are streamed out (256-512 bytes: a few
// lines at a time keep the streaming stores interleaved with the loads; bursts of 512 elements ran
// za1_step at 72-73 % of the probe with 1 thread against 80-83 % for 64, alternated 3 times on the
// AVX-512 dev machine, float32; 2 threads 79-91 % against 86-94 %).
constexpr int64_t kStreamBlock = 64;

// Copies n bytes to dst with non-temporal stores where dst is 64-byte aligned (plain stores for
// the unaligned head and the tail). Only bytes move: results are those of the plain path.
void stream_bytes(char* dst, const char* src, int64_t n) {
  int64_t head = static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  head = head < n ? head : n;
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
#if defined(__AVX512F__)
  for (; i + 64 <= n; i += 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
#elif defined(__AVX2__)
  for (; i + 32 <= n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
#elif defined(__SSE2__)
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
#endif
  std::memcpy(dst + i, src + i, static_cast<size_t>(n - i));
}

// Non-temporal stores are weakly ordered: fence them before the thread leaves the parallel region.
void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// cpu_for_each's column-share loop for an op with a streamed output: each block of z is computed
// into `block` by the op's own body (Op::apply), then streamed to z.
template <class Op>
void cpu_for_each_streamed(const Op& op, int64_t rows, int64_t cols, int nt) {
  using S = std::remove_pointer_t<decltype(op.z.p)>;
  const unsigned fp_mode = caller_fp_mode();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const WorkerFpMode fp(fp_mode);
    const Op local = op;
    alignas(64) S block[kStreamBlock];
    const ColumnShare share = cpu_column_share(cols, omp_get_thread_num(), omp_get_num_threads());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j0 = share.begin; j0 < share.end; j0 += kStreamBlock) {
        const int64_t j1 = j0 + kStreamBlock < share.end ? j0 + kStreamBlock : share.end;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) local.apply(r, j, block, j - j0);
        stream_bytes(reinterpret_cast<char*>(local.z.p + local.z.at(r, j0)), reinterpret_cast<const char*>(block),
                     (j1 - j0) * static_cast<int64_t>(sizeof(S)));
      }
    }
    stream_fence();
  }
}

// Bytes of the widest vector this variant's loops use.
#if defined(__AVX512F__)
constexpr int64_t kVectorBytes = 64;
#elif defined(__AVX__)
constexpr int64_t kVectorBytes = 32;
#else
constexpr int64_t kVectorBytes = 16;
#endif

// Columns [begin, end) of one `omp simd` loop; Lanes > 0 asks for that many lanes.
template <int Lanes, class Op>
inline void simd_range(const Op& op, int64_t r, int64_t begin, int64_t end) {
  if constexpr (Lanes > 0) {
#pragma omp simd simdlen(Lanes)
    for (int64_t j = begin; j < end; ++j) op(r, j);
  } else {
#pragma omp simd
    for (int64_t j = begin; j < end; ++j) op(r, j);
  }
}

// A prox pass over more than kPrefetchMinBytes streams from DRAM; its loops then ask for x's lines
// kPrefetchAhead bytes ahead of the ones they read (__builtin_prefetch: a hint, never a fault, so the
// lines past the end cost nothing but a useless fetch). One thread's hardware prefetchers alone left
// the AMD Zen 5 dev VM's proxes at 81-96 % of torch's in-place probe (python -m bench.isa_table, 1
// thread: L1 84-88 %, MCP and SCAD 91-96 %, forced AVX2 81-89 %); 8 KiB ahead, 111-118 % (SCAD's
// AVX-512 block loop 101-106 %) and 99-108 % with 2 threads (2 KiB: 81-96 %; 16 KiB: as 8). The
// prefetching loops are instantiations of their own (Far), so that passes in cache run the loops
// they ran before: one loop holding both had moved MCP's firm step from 1.1 to 1.4-1.6 x L1 there.
constexpr int64_t kPrefetchMinBytes = int64_t(4) << 20;
constexpr int64_t kPrefetchAhead = 8192;

template <class Op>
struct PrefetchX : std::false_type {};
template <typename S, int IMPL>
struct PrefetchX<ProxOp<S, IMPL>> : std::true_type {};

// Prefetches the lines kPrefetchAhead bytes past x's elements [j, j + n) of row r (the address is
// formed as an integer: near the end of x it lies past the buffer, where a pointer may not point).
template <class Op>
inline void prefetch_x(const Op& op, int64_t r, int64_t j, int64_t n) {
  const int64_t bytes = n * static_cast<int64_t>(sizeof(*op.x.p));
  const uintptr_t at = reinterpret_cast<uintptr_t>(op.x.p + op.x.at(r, j)) + kPrefetchAhead;
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(reinterpret_cast<const void*>(at + b), 0, 3);
}

// Ops whose formula is written for a lane type (prox.h, scad_small) and run here on blocks of
// 512-bit vectors: one instruction the compiler does not derive from the scalar body (vrangeps)
// takes two of its loop's (a min and an OR). SCAD's small step, float32 storage: in
// cache (64 K values, 1 thread, AMD Zen 5) the compiled loop of its two-term form took 1.5x L1's
// time (3.0 against 1.95 us, the loops alone), the block loop takes 1.2x (2.37 us); per call, the
// one-term form 1.12-1.17x -> 1.01-1.03x, the two-term one 1.33-1.39x -> 1.17-1.19x.
template <class Op>
struct LaneBlocks : std::false_type {};
#if defined(__AVX512DQ__)
template <>
struct LaneBlocks<ProxOp<float, kScadSmall>> : std::true_type {};
template <>
struct LaneBlocks<ProxOp<float, kScadSmallEdge>> : std::true_type {};

// Columns [begin, j) of row r in whole blocks; returns j (the rest is the compiled loop's).
template <bool Far, typename S, int IMPL>
inline int64_t block_columns(const ProxOp<S, IMPL>& op, int64_t r, int64_t begin, int64_t end) {
  constexpr int N = 8;
  using B = Block<S, N>;
  const B c0 = splat_block<S, N>(op.k.c0), lo0 = splat_block<S, N>(op.k.lo0), c2 = splat_block<S, N>(op.k.c2),
          lo2 = splat_block<S, N>(op.k.lo2), c3 = splat_block<S, N>(op.k.c3), zero = splat_block<S, N>(op.k.zero),
          one = splat_block<S, N>(op.k.one);
  const S* x = op.x.p + op.x.at(r, 0);
  S* out = op.out.p + op.out.at(r, 0);
  int64_t j = begin;
  for (; j + B::kValues <= end; j += B::kValues) {
    if constexpr (Far) prefetch_x(op, r, j, B::kValues);
    store_block(out + j, scad_small<IMPL == kScadSmallEdge>(load_block<S, N>(x + j), c0, lo0, c2, lo2, c3, zero, one));
  }
  return j;
}
#else
template <bool Far, class Op>
inline int64_t block_columns(const Op&, int64_t, int64_t begin, int64_t) {
  return begin;
}
#endif

// One row's columns [begin, end): blocks of two vectors (the inner loop's constant trip count is
// unrolled completely, so each iteration of the block loop holds the body twice), then the rest.
// A one-vector loop body is short enough that its speed depends on where the linker puts it
// (AMD Zen 5: SCAD's small step, AVX2, float64, the same 14 instructions at each 4-byte offset
// in a 64-byte line: 4.7 us at 13 of the 16 offsets, 5.9 and 7.8 us at the others); the
// two-vector body ran 4.7 us at every offset. Same operations in the same order: same bits.
template <int Lanes, bool Far = false, class Op>
inline void simd_columns(const Op& op, int64_t r, int64_t begin, int64_t end) {
  constexpr int64_t lanes = Lanes > 0 ? Lanes : kVectorBytes / static_cast<int64_t>(sizeof(typename Op::T));
  constexpr int64_t block = 2 * lanes;
  int64_t j0 = begin;
  if constexpr (LaneBlocks<Op>::value) j0 = block_columns<Far>(op, r, begin, end);
  for (; j0 + block <= end; j0 += block) {
    if constexpr (Far) prefetch_x(op, r, j0, block);
    simd_range<Lanes>(op, r, j0, j0 + block);
  }
  simd_range<Lanes>(op, r, j0, end);
}

// Lanes of the loop of an op: the compiler's choice, except for the ops without a prox formula in
// the AVX-512 variant, which run 256-bit vectors. Those updates (cv_step, control_update,
// normalized_delta, box_tensor, the scale passes) take at most 3 arithmetic instructions per
// element, far below what the memory allows at either width, and on the dev machine's Zen 4 the
// 512-bit loops of the 3-stream ones ran ~15 % slower than the same loop with 256-bit vectors
// (cv_step, 1 thread, fastest of 20-100 calls: 6.0-7.5 ms against 5.2-5.5 ms; torch's
// x.addcmul_(g, c) on the same buffers 5.1-6.5 ms). Same operations at either width: same bits.
template <class Op, bool Prox>
constexpr int loop_lanes() {
#if defined(__AVX512F__)
  return Prox ? 0 : static_cast<int>(32 / sizeof(typename Op::T));
#else
  return 0;
#endif
}

template <class Op, int Lanes = 0>
void cpu_for_each(const Op& op, int64_t rows, int64_t cols) {
  const int nt = threads_for(rows * cols);
  if constexpr (StreamedOutput<Op>::value) {
    const int64_t z_bytes = rows * cols * static_cast<int64_t>(sizeof(*op.z.p));
    if (!cpu_split_rows(rows, cols) && z_bytes >= kStreamMinBytes) return cpu_for_each_streamed(op, rows, cols, nt);
  }
  const unsigned fp_mode = caller_fp_mode();  // every worker computes as the caller (fp_env.h)
  if (cpu_split_rows(rows, cols)) {
    // Short rows ([N, small d] stacks): whole rows per thread. Splitting a 10-element row across
    // threads costs a work-sharing construct per row and puts neighbours on one cache line.
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const WorkerFpMode fp(fp_mode);
      const Op local = op;  // a private copy: its scalars cannot alias the buffers being written
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) simd_columns<Lanes>(local, r, 0, cols);
    }
    return;
  }
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const WorkerFpMode fp(fp_mode);
    const Op local = op;  // a private copy: its scalars cannot alias the buffers being written
    const ColumnShare share = cpu_column_share(cols, omp_get_thread_num(), omp_get_num_threads());
    const bool far = rows * cols * static_cast<int64_t>(sizeof(typename Op::T)) > kPrefetchMinBytes;
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (PrefetchX<Op>::value) {  // only prox ops get a prefetching instantiation
        if (far) {
          simd_columns<Lanes, true>(local, r, share.begin, share.end);
          continue;
        }
      }
      simd_columns<Lanes>(local, r, share.begin, share.end);
    }
  }
}

// One chunk's sum in the order of math/reduce.h: the 256 lanes side by side (the loop over lanes
// vectorizes, and each lane still adds its elements in sequence), then the lane tree.
//
// A chunk shorter than 256 elements (the last one of a row; every group-lasso column of a matrix
// with fewer than 256 rows) leaves lanes at exactly +0.0, and adding +0.0 to a sum of squares
// changes no bit (the sums here are never -0.0), so the tree skips those additions: the result is
// the full tree's, bit for bit, without 255 additions per short group.
template <class Term>
double chunk_sum(const Term& term, int64_t r, int64_t k, int64_t cols) {
  alignas(64) double lanes[kReduceLanes];
  const int64_t start = k * kReduceChunk;
  const int64_t end = start + kReduceChunk < cols ? start + kReduceChunk : cols;
  int64_t live = end - start < kReduceLanes ? end - start : kReduceLanes;  // lanes holding an element
  for (int64_t l = 0; l < live; ++l) lanes[l] = 0.0;
  for (int64_t base = start; base < end; base += kReduceLanes) {
    const int64_t n = end - base < kReduceLanes ? end - base : kReduceLanes;
#pragma omp simd
    for (int64_t l = 0; l < n; ++l) lanes[l] += term(r, base + l);
  }
  for (int64_t s = kReduceLanes / 2; s > 0; s >>= 1) {
    const int64_t n = live - s < s ? live - s : s;  // the t < s with t + s < live
#pragma omp simd
    for (int64_t t = 0; t < n; ++t) reduce_tree_step(lanes, t, s);
    if (live > s) live = s;
  }
  return live > 0 ? lanes[0] : 0.0;
}

template <bool Prox>
struct CpuRun {
  const Launch& L;
  template <class Op>
  void operator()(const Op& op) const {
    cpu_for_each<Op, loop_lanes<Op, Prox>()>(op, L.rows, L.cols);
  }
};

}  // namespace

#define FK_DEFINE_CPU(name, Args, Op, prox)              \
  void name(const Launch& L, const Args& a) {            \
    if (L.rows * L.cols == 0) return;                    \
    dispatch_op<Op, prox>(L, a, CpuRun<prox>{L});        \
  }
FK_ELEMENTWISE_OPS(FK_DEFINE_CPU)
#undef FK_DEFINE_CPU

namespace {

// Chunk sums of every row in parallel over (row, chunk) pairs, then one factor per row: the result
// does not depend on the thread count (each chunk sum is computed whole by one thread).
template <template <typename> class Term, class Args, class Factor>
void row_factors(const Launch& L, const Args& a, const Factor& factor_of) {
  auto* scratch = reinterpret_cast<double*>(a.scratch);
  auto* factor = reinterpret_cast<double*>(a.factor);
  const int64_t chunks = reduce_chunks(L.cols);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const Term<S> term(a);
    const int64_t pairs = L.rows * chunks;
    const int nt = threads_for(L.rows * L.cols);
    const unsigned fp_mode = caller_fp_mode();
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      const WorkerFpMode fp(fp_mode);
#pragma omp for schedule(static)
      for (int64_t p = 0; p < pairs; ++p) scratch[p] = chunk_sum(term, p / chunks, p % chunks, L.cols);
    }
  });
  for (int64_t r = 0; r < L.rows; ++r) factor[r] = factor_of(reduce_row_total(scratch + r * chunks, chunks));
}

}  // namespace

void l2_ball_factors(const Launch& L, const SumSqArgs& a) {
  row_factors<SumSqTerm>(L, a, L2BallFactor{a.radius});
}

namespace {

// Column groups (elem_stride = cols, group_stride = 1): the chunk sums of kColumnTile neighbouring
// columns at once, reading each matrix row's kColumnTile contiguous elements instead of one
// element per row and column. Lane l of column j still adds rows l, l + 256, ... of its chunk in
// increasing order, and the tree is the same (with the +0.0 lanes of short chunks skipped, see
// chunk_sum), so every sum has the bits of the generic path and of the device.
constexpr int64_t kColumnTile = 8;

template <typename S>
void column_chunk_sums(const GroupLayout& x, int64_t groups, int64_t rows, double* scratch, int nt) {
  const int64_t cols = x.per_block;
  const int64_t blocks = groups / cols;
  const int64_t chunks = reduce_chunks(rows);
  const int64_t tiles = (cols + kColumnTile - 1) / kColumnTile;
  const int64_t work = blocks * tiles * chunks;
  const S* p = reinterpret_cast<const S*>(x.ptr);
  const unsigned fp_mode = caller_fp_mode();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const WorkerFpMode fp(fp_mode);
#pragma omp for schedule(static)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t k = w % chunks, tile = (w / chunks) % tiles, b = w / (chunks * tiles);
      const int64_t j0 = tile * kColumnTile;
      const int64_t tw = cols - j0 < kColumnTile ? cols - j0 : kColumnTile;
      alignas(64) double lanes[kReduceLanes][kColumnTile];
      const int64_t start = k * kReduceChunk;
      const int64_t end = start + kReduceChunk < rows ? start + kReduceChunk : rows;
      int64_t live = end - start < kReduceLanes ? end - start : kReduceLanes;
      for (int64_t l = 0; l < live; ++l)
        for (int64_t jj = 0; jj < kColumnTile; ++jj) lanes[l][jj] = 0.0;
      for (int64_t i = start; i < end; ++i) {
        double* lane = lanes[(i - start) % kReduceLanes];
        const S* row = p + b * x.block_stride + i * cols + j0;
        for (int64_t jj = 0; jj < tw; ++jj) {
          const double v = static_cast<double>(load(row, jj));
          lane[jj] += v * v;
        }
      }
      for (int64_t s = kReduceLanes / 2; s > 0; s >>= 1) {
        const int64_t n = live - s < s ? live - s : s;
        for (int64_t t = 0; t < n; ++t)
#pragma omp simd
          for (int64_t jj = 0; jj < kColumnTile; ++jj) lanes[t][jj] += lanes[t + s][jj];
        if (live > s) live = s;
      }
      for (int64_t jj = 0; jj < tw; ++jj) scratch[(b * cols + j0 + jj) * chunks + k] = lanes[0][jj];
    }
  }
}

}  // namespace

// Groups are the rows of the reduction (L.rows groups of L.cols elements each); column groups of
// a matrix take the tiled path above.
void group_lasso_factors(const Launch& L, const GroupSumSqArgs& a) {
  const bool columns = a.x.group_stride == 1 && a.x.elem_stride == a.x.per_block && a.x.per_block > 1;
  if (!columns || L.cols == 0) {
    row_factors<GroupSumSqTerm>(L, a, GroupLassoFactor{a.threshold});
    return;
  }
  auto* scratch = reinterpret_cast<double*>(a.scratch);
  auto* factor = reinterpret_cast<double*>(a.factor);
  const int64_t chunks = reduce_chunks(L.cols);
  dispatch_dtype(L.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    column_chunk_sums<S>(a.x, L.rows, L.cols, scratch, threads_for(L.rows * L.cols));
  });
  const GroupLassoFactor factor_of{a.threshold};
  for (int64_t g = 0; g < L.rows; ++g) factor[g] = factor_of(reduce_row_total(scratch + g * chunks, chunks));
}

}  // namespace FK_CPU_ISA
}  // namespace fk
