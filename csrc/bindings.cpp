// pybind11 module fedkernels._C. It does not link libtorch: every kernel takes raw data pointers,
// row strides (in elements), a [rows, cols] extent, a dtype code and, for CUDA, a device index and
// stream handle. Validation happens in Python (fedkernels/_validate.py) before anything here runs,
// so a rejected call never touches a buffer.
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "cpu/isa.h"
#include "cuda/device_guard.h"
#include "cuda/launch_body.h"
#include "dispatch.h"
#include "writable.h"

namespace py = pybind11;
using namespace fk;

namespace {

enum Backend : int { kCpu = 0, kCuda = 1, kCudaEmulated = 2 };

EmulationConfig g_emulation;

template <class Args>
void run(int backend, const Launch& L, const Args& a, void (*cpu)(const Launch&, const Args&),
         void (*cuda)(const Launch&, const Args&),
         void (*emulated)(const Launch&, const Args&, const EmulationConfig&)) {
  switch (backend) {
    case kCpu: {
      py::gil_scoped_release release;
      cpu(L, a);
      break;
    }
    case kCuda:
      cuda(L, a);
      break;
    case kCudaEmulated:
      emulated(L, a, g_emulation);
      break;
    default:
      throw std::invalid_argument("fedkernels: unknown backend " + std::to_string(backend));
  }
}

#define FK_RUN(name, L, a) run(backend, L, a, &name##_cpu, &name##_cuda, &name##_cuda_emulated)

Launch make_launch(int dtype, int device, uintptr_t stream, int64_t rows, int64_t cols) {
  Launch L;
  L.dtype = dtype;
  L.device = device;
  L.stream = stream;
  L.rows = rows;
  L.cols = cols;
  return L;
}

Operand operand(uintptr_t p, int64_t s) {
  Operand o;
  o.ptr = p;
  o.row_stride = s;
  return o;
}

ProxPlan plan_checked(int kind, double step, double p1, double p2) {
  const ProxPlan plan = plan_prox(kind, step, p1, p2);
  if (plan.impl < 0) throw std::invalid_argument("fedkernels: unknown prox kind " + std::to_string(kind));
  return plan;
}

// A device API that only records: what the CUDA device guard does, for tests without a GPU.
struct RecordingDeviceApi {
  int device;
  std::vector<int> with_context;
  std::vector<int> calls;  // devices passed to set/restore, in order
  int current() { return device; }
  void set(int d) { calls.push_back(d); device = d; }
  void restore(int d) { set(d); }
  bool has_context(int d) {
    for (int c : with_context)
      if (c == d) return true;
    return false;
  }
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fedkernels raw kernels (pointer-level; use fedkernels.ops or fedkernels.raw instead)";

  m.def("prox", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows, int64_t cols,
                   uintptr_t x, int64_t xs, uintptr_t out, int64_t outs, int kind, double step,
                   double p1, double p2) {
    ProxArgs a{operand(x, xs), operand(out, outs), plan_checked(kind, step, p1, p2)};
    FK_RUN(prox, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("box_tensor", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                         int64_t cols, uintptr_t x, int64_t xs, uintptr_t out, int64_t outs,
                         uintptr_t lo, int64_t los, uintptr_t hi, int64_t his) {
    BoxTensorArgs a{operand(x, xs), operand(out, outs), operand(lo, los), operand(hi, his)};
    FK_RUN(box_tensor, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("cv_step", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                      int64_t cols, uintptr_t x, int64_t xs, uintptr_t g, int64_t gs, uintptr_t c,
                      int64_t cs, double beta) {
    CvStepArgs a{operand(x, xs), operand(g, gs), operand(c, cs), beta};
    FK_RUN(cv_step, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("normalized_delta", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                               int64_t cols, uintptr_t out, int64_t outs, uintptr_t z, int64_t zs,
                               uintptr_t x, int64_t xs, double inv_scale) {
    NormalizedDeltaArgs a{operand(out, outs), operand(z, zs), operand(x, xs), inv_scale};
    FK_RUN(normalized_delta, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("control_update", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                             int64_t cols, uintptr_t c, int64_t cs, uintptr_t dbar, int64_t dbs,
                             uintptr_t d, int64_t ds) {
    ControlUpdateArgs a{operand(c, cs), operand(dbar, dbs), operand(d, ds)};
    FK_RUN(control_update, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("prox_grad_step", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                             int64_t cols, uintptr_t x, int64_t xs, uintptr_t g, int64_t gs,
                             double lr, int kind, double step, double p1, double p2) {
    ProxGradStepArgs a{operand(x, xs), operand(g, gs), lr, plan_checked(kind, step, p1, p2)};
    FK_RUN(prox_grad_step, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("normal_map_step", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                              int64_t cols, uintptr_t z, int64_t zs, uintptr_t x, int64_t xs,
                              uintptr_t g, int64_t gs, uintptr_t c, int64_t cs, double eta,
                              double inv_lam, int kind, double step, double p1, double p2) {
    NormalMapArgs a{operand(z, zs), operand(x, xs), operand(g, gs), operand(c, cs),
                    eta,           inv_lam,         plan_checked(kind, step, p1, p2)};
    FK_RUN(normal_map_step, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("za1_step", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                       int64_t cols, uintptr_t zhat, int64_t zhs, uintptr_t z, int64_t zs,
                       uintptr_t g, int64_t gs, uintptr_t c, int64_t cs, double eta, int kind,
                       double step, double p1, double p2) {
    Za1StepArgs a{operand(zhat, zhs), operand(z, zs), operand(g, gs), operand(c, cs), eta,
                  plan_checked(kind, step, p1, p2)};
    FK_RUN(za1_step, make_launch(dtype, device, stream, rows, cols), a);
  });

  m.def("depositum_step", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                             int64_t cols, uintptr_t x, int64_t xs, uintptr_t mm, int64_t ms,
                             uintptr_t y, int64_t ys, double alpha, double beta, double w,
                             bool snag, int kind, double step, double p1, double p2) {
    DepositumArgs a{operand(x, xs), operand(mm, ms), operand(y, ys), alpha, beta, w, snag,
                    plan_checked(kind, step, p1, p2)};
    FK_RUN(depositum_step, make_launch(dtype, device, stream, rows, cols), a);
  });

  // l2_ball_: the reduction (per-row factors in `factor`, chunk sums in `scratch`, sized by
  // l2_ball_scratch_size), then the scale pass. Two launches on one stream, no host sync.
  m.def("l2_ball", [](int backend, int dtype, int device, uintptr_t stream, int64_t rows,
                      int64_t cols, uintptr_t x, int64_t xs, uintptr_t center, int64_t cs,
                      bool has_center, uintptr_t scratch, uintptr_t factor, double radius) {
    const Launch L = make_launch(dtype, device, stream, rows, cols);
    SumSqArgs reduce{operand(x, xs), operand(center, cs), scratch, factor, radius, has_center};
    FK_RUN(l2_ball_factors, L, reduce);
    L2BallArgs scale{operand(x, xs), operand(center, cs), factor, has_center};
    FK_RUN(l2_ball_scale, L, scale);
  });
  m.def("l2_ball_scratch_size", [](int64_t rows, int64_t cols) { return rows * reduce_chunks(cols); });

  // group_lasso_ on `blocks` row-major [rows, cols] matrices, block_stride elements apart: the
  // reduction over the groups (rows, or columns with by_column; factors max(0, 1 - threshold /
  // ||x_g||) in `factor`, chunk sums in `scratch`, sized by l2_ball_scratch_size(groups, group
  // length)), then the scale pass in row-major order. No host sync.
  m.def("group_lasso", [](int backend, int dtype, int device, uintptr_t stream, int64_t blocks,
                          int64_t rows, int64_t cols, uintptr_t x, int64_t block_stride,
                          bool by_column, uintptr_t scratch, uintptr_t factor, double threshold) {
    if (blocks * rows * cols == 0) return;
    const GroupLayout layout = by_column ? GroupLayout{x, cols, block_stride, 1, cols}
                                         : GroupLayout{x, rows, block_stride, cols, 1};
    const Launch reduce_launch = by_column ? make_launch(dtype, device, stream, blocks * cols, rows)
                                           : make_launch(dtype, device, stream, blocks * rows, cols);
    GroupSumSqArgs reduce{layout, scratch, factor, threshold};
    FK_RUN(group_lasso_factors, reduce_launch, reduce);
    GroupScaleArgs scale{x, rows, cols, block_stride, by_column, factor};
    FK_RUN(group_scale, make_launch(dtype, device, stream, blocks * rows, cols), scale);
  });

  // Gathered batched linear products (CPU only; fedkernels.raw.linear_gathered*): mat is W [c, o, i]
  // (forward) or D [c, o, P] (weight grad), out [c, o, P] or [c, o, i]; strides between clients.
  // Throws (writing nothing) if an entry of idx is outside [0, n).
  m.def("linear_gathered", [](bool weight_grad, int dtype, int64_t c, int64_t o, int64_t i, int64_t P, int64_t n,
                              uintptr_t mat, int64_t mat_stride, uintptr_t x, uintptr_t idx, uintptr_t out,
                              int64_t out_stride) {
    const int64_t* rows = reinterpret_cast<const int64_t*>(idx);
    for (int64_t k = 0; k < c * P; ++k)
      if (rows[k] < 0 || rows[k] >= n)
        throw std::invalid_argument("idx must hold row numbers of X in [0, " + std::to_string(n) + "), got " +
                                    std::to_string(rows[k]) + " at idx[" + std::to_string(k / P) + ", " +
                                    std::to_string(k % P) + "]");
    GatherLinearArgs a;
    a.dtype = dtype;
    a.clients = c;
    a.outputs = o;
    a.inputs = i;
    a.samples = P;
    a.mat = mat;
    a.mat_stride = mat_stride;
    a.x = x;
    a.idx = idx;
    a.out = out;
    a.out_stride = out_stride;
    py::gil_scoped_release release;
    if (weight_grad)
      linear_gathered_weight_grad_cpu(a);
    else
      linear_gathered_cpu(a);
  });

  m.def("plan_prox", [](int kind, double step, double p1, double p2) {
    const ProxPlan p = plan_checked(kind, step, p1, p2);
    return std::make_tuple(p.impl, p.c0, p.c1, p.c2, p.c3, p.c4);
  });
  m.def("set_emulation_config", [](int64_t gx, int64_t gy, int64_t block) {
    if (gx < 1 || gy < 1 || block < 1) throw std::invalid_argument("emulation grid must be >= 1");
    g_emulation = EmulationConfig{gx, gy, block};
  });
  m.def("is_writable", &is_writable,
        "True if the byte at ptr (and ptr + nbytes - 1) can be written; writes nothing");
  m.def("set_cpu_isa", &cpu_set_isa, "test hook: force a CPU kernel variant ('auto' = detected)");
  m.def("cpu_isa", &cpu_isa);
  m.def("cpu_isa_variants", &cpu_isa_variants);
  m.def("cpu_isa_source", &cpu_isa_source,
        "why this variant: 'detected', 'FEDKERNELS_CPU_ISA' (the environment variable), 'set_cpu_isa' or "
        "the calibration's source");
  m.def("choose_elementwise_isa", &cpu_choose_elementwise_isa,
        "the variants picked by calibration ('auto': none) for the elementwise kernels with a prox and for "
        "the plain ones, with their source");
  m.def("cpu_plain_isa", &cpu_plain_isa);
  m.def("cpu_gather_isa", &cpu_gather_isa);
  m.def("cpu_column_share", [](int64_t cols, int thread, int threads) {
    if (cols < 0 || threads < 1 || thread < 0 || thread >= threads)
      throw std::invalid_argument("need cols >= 0 and 0 <= thread < threads");
    const ColumnShare s = cpu_column_share(cols, thread, threads);
    return std::make_tuple(s.begin, s.end);
  }, "the columns [begin, end) one thread of a CPU elementwise pass takes");
  m.def("cpu_only_by_request", []() {
#if defined(FK_CPU_ONLY_REQUESTED)
    return true;
#else
    return false;
#endif
  }, "True if the build skipped CUDA because FEDKERNELS_CPU_ONLY=1 asked it to");
  m.def("cpu_splits_rows", &cpu_split_rows,
        "True if the CPU kernels give each thread whole rows of a [rows, cols] block");
  m.def("device_guard_trace", [](int current, int target, std::vector<int> with_context) {
    RecordingDeviceApi api{current, std::move(with_context), {}};
    { BasicDeviceGuard<RecordingDeviceApi> guard(api, target); }
    return api.calls;
  }, "devices the CUDA device guard selects (entering, then leaving) for a launch on `target`");
  m.def("cuda_launch_config", [](int64_t rows, int64_t cols) {
    // The grid an elementwise CUDA launch uses (introspection for tests; no GPU needed).
    const LaunchConfig c = make_launch_config(rows, cols, kCudaMaxGridX, kCudaMaxGridY, kCudaBlock);
    return std::make_tuple(c.grid.x, c.grid.y, c.block.x, c.flat);
  });
  m.def("set_num_threads", &cpu_set_num_threads);
  m.def("get_num_threads", &cpu_get_num_threads);
  m.def("thread_limit", &cpu_thread_limit);
  m.def("simd", &cpu_simd_description);
  m.def("cuda_compiled", &cuda_compiled);
  m.def("cuda_archs", &cuda_archs);
  m.def("cuda_runtime_version", &cuda_runtime_version);
  m.def("cuda_device_count", []() {
    std::string err;
    const int n = cuda_device_count(&err);
    return std::make_tuple(n, err);
  });
}
