// Gathered batched linear products (see gather_linear.h), compiled once per instruction set like
// kernels.cpp. The rows X[idx[j, p]] are read in place: they are scattered over a sample matrix far
// larger than the caches, so each one comes from DRAM, and the loops prefetch the rows (or row
// slabs) they will need next while computing with the current ones; a plain gather of random
// 3 KiB rows runs at about half the bandwidth of a prefetched one, and on 4 KiB pages every row
// also costs a page walk (X on huge pages: forward ~20 % faster at o = 10). From o = 64 on, W
// (forward) and the gradient (weight grad) no longer fit in L2 either, and their next lines are
// prefetched too.
//
// The forward's dot products end in lane sums: they are folded in trees over the block's
// accumulators (lane_sums), about 3 instructions per output instead of ~28 for a scalar sum of lanes
// (forward 8 % faster with the operands in cache, o = 10).
//
// Both products are register-blocked on the widest vector of the variant (GCC vector extensions,
// so one source serves every ISA). Each client is computed by one thread in one fixed order, so its
// result does not depend on the thread count or on the other clients. This file is compiled with
// -ffp-contract=fast (CMakeLists.txt): the AVX2 and AVX-512 variants use FMA, so different variants
// may round differently (the elementwise kernels' cross-variant bit identity does not apply here);
// one variant is always bit-reproducible.
#include <omp.h>

#include <array>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../dispatch.h"
#include "fp_env.h"
#include "gather_linear.h"
#include "isa.h"

namespace fk {
namespace FK_CPU_ISA {
namespace {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
// 32 vector registers: forward 5 samples x 5 outputs, weight grad 5 outputs x 5 chunks (25
// accumulators; of the blockings tried, 4x5, 6x4, 8x3, 4x6 (forward) and 5x4, 6x4, 4x6, 8x3, this
// ran fastest with the operands in cache, o = 128: 77 / 72 us per client against bmm 74 / 70).
constexpr int kFwdSamples = 5, kFwdOutputs = 5, kGradOutputs = 5, kGradChunks = 5;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
// 16 vector registers: 12 or 10 accumulators (a 4 x 3 weight-grad block spilled: 1.5x slower).
constexpr int kFwdSamples = 3, kFwdOutputs = 4, kGradOutputs = 5, kGradChunks = 2;
#else
constexpr int kVecBytes = 16;
constexpr int kFwdSamples = 2, kFwdOutputs = 5, kGradOutputs = 5, kGradChunks = 2;
#endif

template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};
template <class T>
using Vec = typename VecOf<T>::type;
template <class T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

template <class T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
// The first n lanes from p, the others 0.
template <class T>
inline Vec<T> load_part(const T* p, int64_t n) {
  Vec<T> v = {};
  std::memcpy(&v, p, static_cast<size_t>(n) * sizeof(T));
  return v;
}
template <class T>
inline void store_part(T* p, const Vec<T>& v, int64_t n) {
  std::memcpy(p, &v, static_cast<size_t>(n) * sizeof(T));
}
// Every lane x: a broadcast load (`V{} + x` adds 0 first, as -0 + 0 is +0; x - 0 is x always).
template <class T>
inline Vec<T> splat(T x) {
  return x - Vec<T>{};
}
// Integer vector of the same lane count and width as Vec<T> (the lane indices of a shuffle).
template <class T>
struct MaskOf;
template <>
struct MaskOf<float> {
  typedef int32_t type __attribute__((vector_size(kVecBytes)));
};
template <>
struct MaskOf<double> {
  typedef int64_t type __attribute__((vector_size(kVecBytes)));
};

// One level of the lane-sum tree: u and v each hold L / S sources in segments of S lanes; the
// result holds u's sources then v's, each folded to S / 2 lanes (its low half + its high half).
template <class T, int S>
inline Vec<T> fold(const Vec<T>& u, const Vec<T>& v) {
  constexpr int L = kLanes<T>, H = S / 2, per = L / S;
  typename MaskOf<T>::type lo, hi;
  for (int j = 0; j < L; ++j) {
    const int q = j / H, off = j % H;                            // lane off of output source q
    const int base = q < per ? 0 : L, first = (q % per) * S;  // in u (lanes 0..) or v (lanes L..)
    lo[j] = base + first + off;
    hi[j] = base + first + H + off;
  }
  return __builtin_shuffle(u, v, lo) + __builtin_shuffle(u, v, hi);
}
// b[0 .. S): vectors of L / S sources each (segments of S lanes) -> b[0]: every source's sum.
template <class T, int S>
inline void fold_levels(Vec<T>* b) {
  if constexpr (S > 1) {
    for (int k = 0; k < S / 2; ++k) b[k] = fold<T, S>(b[2 * k], b[2 * k + 1]);
    fold_levels<T, S / 2>(b);
  }
}
// sums[n] = the sum of the lanes of v[n], n < N: trees of L - 1 folds (2 shuffles and an add each)
// per L sources instead of L - 1 extracts and adds per source. A fixed order: the same bits always.
template <class T, int N>
inline void lane_sums(const Vec<T>* v, T* sums) {
  constexpr int L = kLanes<T>;
  for (int g = 0; g < N; g += L) {
    Vec<T> b[L];
    for (int k = 0; k < L; ++k) b[k] = g + k < N ? v[g + k] : Vec<T>{};
    fold_levels<T, L>(b);
    std::memcpy(sums + g, &b[0], sizeof(b[0]));
  }
}

inline void prefetch(const void* p) {
#if defined(__SSE2__)
  // T1 (L2 and out): the rows are used over many vector steps, and L1 is kept for the operands of
  // the current step. (A measured random-row copy: 8 GB/s plain, ~14 GB/s with T1 prefetch.)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T1);
#else
  __builtin_prefetch(p, 0, 2);
#endif
}
// One line of a row further ahead than prefetch() reaches: it starts the row's page walk early.
inline void prefetch_first_line(const void* p) {
#if defined(__SSE2__)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p, 0, 3);
#endif
}
// Every 64-byte line of [p, p + bytes).
inline void prefetch_lines(const char* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) prefetch(p + b);
}

// ---- forward: out[k, p] = sum_e W[k, e] * X[idx[p], e] ----------------------------------------

// One S-sample x K-output block over all inputs. rows: the S sample rows; out: &out[k0, p0] (row
// stride P). next[0 .. n_next): rows to prefetch for the following block, a line of each per step.
template <class T, int S, int K>
void forward_block(const T* w, int64_t inputs, const T* const* rows, T* out, int64_t P, const T* const* next,
                   int n_next) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  V acc[S][K] = {};
  const int64_t full = inputs / L * L;
  for (int64_t e = 0; e < full; e += L) {
    for (int s = 0; s < n_next; ++s) prefetch(next[s] + e);
    V xv[S];
    for (int s = 0; s < S; ++s) xv[s] = load(rows[s] + e);
    for (int k = 0; k < K; ++k) {
      const V wv = load(w + k * inputs + e);
      for (int s = 0; s < S; ++s) acc[s][k] += wv * xv[s];
    }
  }
  if (full < inputs) {  // zero lanes past the end contribute 0 * 0
    const int64_t n = inputs - full;
    V xv[S];
    for (int s = 0; s < S; ++s) xv[s] = load_part(rows[s] + full, n);
    for (int k = 0; k < K; ++k) {
      const V wv = load_part(w + k * inputs + full, n);
      for (int s = 0; s < S; ++s) acc[s][k] += wv * xv[s];
    }
  }
  constexpr int N = S * K;
  T sums[(N + L - 1) / L * L];
  lane_sums<T, N>(&acc[0][0], sums);
  for (int s = 0; s < S; ++s)
    for (int k = 0; k < K; ++k) out[k * P + s] = sums[s * K + k];
}

template <class T>
using ForwardFn = void (*)(const T*, int64_t, const T* const*, T*, int64_t, const T* const*, int);

// forward_block<T, s + 1, k + 1> at [s][k], for the partial blocks at the edges.
template <class T, int S, int... Ks>
constexpr std::array<ForwardFn<T>, sizeof...(Ks)> forward_row(std::integer_sequence<int, Ks...>) {
  return {&forward_block<T, S, Ks + 1>...};
}
template <class T, int... Ss>
constexpr std::array<std::array<ForwardFn<T>, kFwdOutputs>, sizeof...(Ss)> forward_table(
    std::integer_sequence<int, Ss...>) {
  return {forward_row<T, Ss + 1>(std::make_integer_sequence<int, kFwdOutputs>{})...};
}

template <class T>
void forward_client(const T* w, const T* x, const int64_t* idx, const int64_t* next_idx, T* out, int64_t outputs,
                    int64_t inputs, int64_t P) {
  static constexpr auto table = forward_table<T>(std::make_integer_sequence<int, kFwdSamples>{});
  for (int64_t p0 = 0; p0 < P; p0 += kFwdSamples) {
    const int ns = static_cast<int>(P - p0 < kFwdSamples ? P - p0 : kFwdSamples);
    const T* rows[kFwdSamples];
    const T* next[kFwdSamples];
    int n_next = 0;
    for (int s = 0; s < kFwdSamples; ++s) {
      rows[s] = x + idx[p0 + (s < ns ? s : 0)] * inputs;
      // the rows of the next block: this client's, then the next client's first ones
      const int64_t q = p0 + kFwdSamples + s;
      const int64_t* src = q < P ? idx + q : (next_idx && q - P < P ? next_idx + (q - P) : nullptr);
      if (src) next[n_next++] = x + *src * inputs;
      // The first line of each row of the block after that: its page's translation is then ready
      // when the row's other lines are prefetched (a random row is a TLB miss on 4 KiB pages, and a
      // page walk delays every prefetch behind it): forward 6-9 % faster at c = 80, o = 10 on 4 KiB
      // pages; no change with X on huge pages (fedkernels.raw.huge_page_copy), which is faster still.
      const int64_t q2 = q + kFwdSamples;
      const int64_t* src2 = q2 < P ? idx + q2 : (next_idx && q2 - P < P ? next_idx + (q2 - P) : nullptr);
      if (src2) prefetch_first_line(x + *src2 * inputs);
    }
    // The prefetches are spread over the output blocks (each takes an even share of the next rows),
    // so that they go out at about the rate the rows are consumed instead of in one burst.
    const int64_t blocks = (outputs + kFwdOutputs - 1) / kFwdOutputs;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * kFwdOutputs;
      const int nk = static_cast<int>(outputs - k0 < kFwdOutputs ? outputs - k0 : kFwdOutputs);
      const int first = static_cast<int>(b * n_next / blocks), last = static_cast<int>((b + 1) * n_next / blocks);
      const T* pf[kFwdSamples + kFwdOutputs];
      int n_pf = 0;
      for (int s = first; s < last; ++s) pf[n_pf++] = next[s];
      // The first sample block also brings in the next output block's rows of W (o * i values per
      // client: from o = 64 on, W comes from memory and its rows are read kFwdOutputs at a time).
      if (p0 == 0)
        for (int64_t k = k0 + kFwdOutputs; k < k0 + 2 * kFwdOutputs && k < outputs; ++k) pf[n_pf++] = w + k * inputs;
      table[ns - 1][nk - 1](w + k0 * inputs, inputs, rows, out + k0 * P + p0, P, pf, n_pf);
    }
  }
}

// ---- weight gradient: out[k, e] = sum_p D[k, p] * X[idx[p], e] ---------------------------------

// K outputs x C vector chunks from column e0, summed over the P rows in order p = 0, 1, ...
// (C == 1 with tail > 0: one chunk of `tail` lanes). pf (or nullptr): P row pointers already offset
// to the slab to prefetch, pf_bytes long each; this block prefetches rows pf_first, + pf_step, ...
template <class T, int K, int C>
void grad_block(const T* d, int64_t P, const T* const* rows, int64_t e0, int64_t tail, T* out, int64_t inputs,
                const T* const* pf, int64_t pf_bytes, int64_t pf_first, int64_t pf_step) {
  using V = Vec<T>;
  constexpr int L = kLanes<T>;
  V acc[K][C] = {};
  // The output lines of the next slab of these K rows: each block writes short pieces of rows
  // `inputs` apart, a pattern the hardware prefetchers miss, and for o >= 64 the output (o * i
  // values per client) does not stay in L2, so the stores would wait for their lines.
  const int64_t next_col = e0 + C * L;
  if (next_col < inputs) {
    const int64_t bytes = (inputs - next_col < C * L ? inputs - next_col : C * L) * static_cast<int64_t>(sizeof(T));
    for (int k = 0; k < K; ++k) prefetch_lines(reinterpret_cast<const char*>(out + k * inputs + next_col), bytes);
  }
  int64_t pf_next = pf ? pf_first : P;
  for (int64_t p = 0; p < P; ++p) {
    if (p == pf_next) {
      prefetch_lines(reinterpret_cast<const char*>(pf[p]), pf_bytes);
      pf_next += pf_step;
    }
    V xv[C];
    if (C == 1 && tail > 0) {
      xv[0] = load_part(rows[p] + e0, tail);
    } else {
      for (int c = 0; c < C; ++c) xv[c] = load(rows[p] + e0 + c * L);
    }
    for (int k = 0; k < K; ++k) {
      const V dv = splat<T>(d[k * P + p]);
      for (int c = 0; c < C; ++c) acc[k][c] += dv * xv[c];
    }
  }
  for (int k = 0; k < K; ++k) {
    if (C == 1 && tail > 0) {
      store_part(out + k * inputs + e0, acc[k][0], tail);
    } else {
      for (int c = 0; c < C; ++c) store_part(out + k * inputs + e0 + c * L, acc[k][c], L);
    }
  }
}

template <class T>
using GradFn = void (*)(const T*, int64_t, const T* const*, int64_t, int64_t, T*, int64_t, const T* const*,
                        int64_t, int64_t, int64_t);

template <class T, int K, int... Cs>
constexpr std::array<GradFn<T>, sizeof...(Cs)> grad_row(std::integer_sequence<int, Cs...>) {
  return {&grad_block<T, K, Cs + 1>...};
}
template <class T, int... Ks>
constexpr std::array<std::array<GradFn<T>, kGradChunks>, sizeof...(Ks)> grad_table(std::integer_sequence<int, Ks...>) {
  return {grad_row<T, Ks + 1>(std::make_integer_sequence<int, kGradChunks>{})...};
}

// rows / next_rows: this client's and the next client's (or empty) P row pointers; pf: scratch.
template <class T>
void grad_client(const T* d, const std::vector<const T*>& rows, const std::vector<const T*>& next_rows,
                 std::vector<const T*>& pf, T* out, int64_t outputs, int64_t inputs, int64_t P) {
  static constexpr auto table = grad_table<T>(std::make_integer_sequence<int, kGradOutputs>{});
  constexpr int L = kLanes<T>;
  constexpr int64_t slab = int64_t(kGradChunks) * L;  // columns per block
  for (int64_t e0 = 0; e0 < inputs; e0 += slab) {
    const int64_t cols = inputs - e0 < slab ? inputs - e0 : slab;
    const int64_t chunks = cols / L, tail = cols - chunks * L;
    // Prefetch the next slab of every row while the first output block runs (after the last
    // slab: the next client's first one).
    const bool last = e0 + slab >= inputs;
    const std::vector<const T*>* pf_src = last ? &next_rows : &rows;
    const int64_t pf_col = last ? 0 : e0 + slab;
    const int64_t pf_cols = last ? (inputs < slab ? inputs : slab) : (inputs - pf_col < slab ? inputs - pf_col : slab);
    const bool prefetching = !pf_src->empty();
    if (prefetching)
      for (int64_t p = 0; p < P; ++p) pf[p] = (*pf_src)[p] + pf_col;
    // spread over the output blocks: block b prefetches rows b, b + blocks, ...
    const int64_t blocks = (outputs + kGradOutputs - 1) / kGradOutputs;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * kGradOutputs;
      const int nk = static_cast<int>(outputs - k0 < kGradOutputs ? outputs - k0 : kGradOutputs);
      const T* dk = d + k0 * P;
      T* ok = out + k0 * inputs;
      const T* const* pf_now = prefetching && chunks > 0 ? pf.data() : nullptr;
      if (chunks > 0)
        table[nk - 1][chunks - 1](dk, P, rows.data(), e0, 0, ok, inputs, pf_now,
                                  pf_cols * static_cast<int64_t>(sizeof(T)), b, blocks);
      if (tail > 0)
        table[nk - 1][0](dk, P, rows.data(), e0 + chunks * L, tail, ok, inputs,
                         prefetching && chunks == 0 ? pf.data() : nullptr, pf_cols * static_cast<int64_t>(sizeof(T)),
                         b, blocks);
    }
  }
}

int threads_for(const GatherLinearArgs& a) {
  const int t = cpu_threads_for(a.clients * a.samples * a.inputs);
  return static_cast<int64_t>(t) < a.clients ? t : static_cast<int>(a.clients);
}

template <class T>
void forward(const GatherLinearArgs& a) {
  const T* w = reinterpret_cast<const T*>(a.mat);
  const T* x = reinterpret_cast<const T*>(a.x);
  const int64_t* idx = reinterpret_cast<const int64_t*>(a.idx);
  T* out = reinterpret_cast<T*>(a.out);
  const int64_t c = a.clients, P = a.samples;
  const int nt = threads_for(a);
  const unsigned fp_mode = caller_fp_mode();  // every worker computes as the caller (fp_env.h)
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const WorkerFpMode fp(fp_mode);
#pragma omp for schedule(static)
    for (int64_t j = 0; j < c; ++j)
      forward_client(w + j * a.mat_stride, x, idx + j * P, j + 1 < c ? idx + (j + 1) * P : nullptr,
                     out + j * a.out_stride, a.outputs, a.inputs, P);
  }
}

template <class T>
void weight_grad(const GatherLinearArgs& a) {
  const T* d = reinterpret_cast<const T*>(a.mat);
  const T* x = reinterpret_cast<const T*>(a.x);
  const int64_t* idx = reinterpret_cast<const int64_t*>(a.idx);
  T* out = reinterpret_cast<T*>(a.out);
  const int64_t c = a.clients, P = a.samples, inputs = a.inputs;
  const int nt = threads_for(a);
  const unsigned fp_mode = caller_fp_mode();
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const WorkerFpMode fp(fp_mode);
    std::vector<const T*> rows(P), next_rows, pf(P);
#pragma omp for schedule(static)
    for (int64_t j = 0; j < c; ++j) {
      for (int64_t p = 0; p < P; ++p) rows[p] = x + idx[j * P + p] * inputs;
      next_rows.clear();
      if (j + 1 < c)
        for (int64_t p = 0; p < P; ++p) next_rows.push_back(x + idx[(j + 1) * P + p] * inputs);
      grad_client(d + j * a.mat_stride, rows, next_rows, pf, out + j * a.out_stride, a.outputs, inputs, P);
    }
  }
}

}  // namespace

void linear_gathered(const GatherLinearArgs& a) {
  if (a.clients == 0) return;
  if (a.dtype == kFloat32) return forward<float>(a);
  if (a.dtype == kFloat64) return forward<double>(a);
  throw std::invalid_argument("fedkernels: linear_gathered supports float32 and float64 only");
}

void linear_gathered_weight_grad(const GatherLinearArgs& a) {
  if (a.clients == 0) return;
  if (a.dtype == kFloat32) return weight_grad<float>(a);
  if (a.dtype == kFloat64) return weight_grad<double>(a);
  throw std::invalid_argument("fedkernels: linear_gathered_weight_grad supports float32 and float64 only");
}

}  // namespace FK_CPU_ISA
}  // namespace fk
