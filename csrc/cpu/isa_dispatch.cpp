// Runtime choice of the CPU kernel variant, and CPU threading settings.
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "isa.h"

namespace fk {
namespace {

// Below this many elements a parallel region costs more than it saves (waking a thread costs a
// few microseconds, about what one core streams through 32 K floats).
constexpr int64_t kParallelMinElements = 1 << 15;

std::atomic<int> g_num_threads{0};  // 0 = OpenMP's default

enum class Isa { kBaseline, kAvx2, kAvx512 };

Isa detect_isa() {
#if defined(FK_HAVE_X86_VARIANTS)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
    return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
#endif
  return Isa::kBaseline;
}

const char* isa_name(Isa i) {
  return i == Isa::kAvx512 ? "avx512" : (i == Isa::kAvx2 ? "avx2" : "baseline");
}

// The variants this CPU runs, best last ("baseline,avx2,avx512").
std::string usable_variants() {
  const Isa best = detect_isa();
  std::string out = "baseline";
  if (best == Isa::kAvx2 || best == Isa::kAvx512) out += ",avx2";
  if (best == Isa::kAvx512) out += ",avx512";
  return out;
}

// `name` as an Isa, or -1 for "auto"; `what` names the setting in the error (a variant this CPU
// cannot run would die of SIGILL, so it is refused here).
int parse_isa(const std::string& name, const std::string& what) {
  if (name == "auto") return -1;
  const std::string usable = "," + usable_variants() + ",";
  if (usable.find("," + name + ",") == std::string::npos)
    throw std::invalid_argument(what + " must be 'auto' or a variant this CPU runs (" + usable_variants() +
                                "), got '" + name + "'");
  return name == "avx512" ? static_cast<int>(Isa::kAvx512)
                          : (name == "avx2" ? static_cast<int>(Isa::kAvx2) : static_cast<int>(Isa::kBaseline));
}

constexpr const char* kIsaEnv = "FEDKERNELS_CPU_ISA";

// The process's variant, fixed at the first kernel call: FEDKERNELS_CPU_ISA when set (and not
// "auto"), else the best the CPU runs. A bad value throws at every call (the static stays unset).
struct IsaChoice {
  Isa isa;
  const char* source;
};
const IsaChoice& process_isa() {
  static const IsaChoice chosen = [] {
    const char* env = std::getenv(kIsaEnv);
    const int forced = env && *env ? parse_isa(env, std::string("the environment variable ") + kIsaEnv) : -1;
    return forced < 0 ? IsaChoice{detect_isa(), "detected"} : IsaChoice{static_cast<Isa>(forced), kIsaEnv};
  }();
  return chosen;
}

// Tests force a variant (_C.set_cpu_isa) to check that every variant gives the same bits; -1 =
// the process's own (process_isa).
std::atomic<int> g_isa_override{-1};

Isa isa() {
  const int forced = g_isa_override.load(std::memory_order_relaxed);
  return forced < 0 ? process_isa().isa : static_cast<Isa>(forced);
}

// The elementwise kernel families (FK_ELEMENTWISE_OPS and the row reductions) give the same bits in
// every variant (tests/test_isa_variants.py), so fedkernels/_calibrate.py may pick the fastest one
// on this CPU, one for the families with a prox formula and one for the plain updates and row
// reductions (cpu_choose_elementwise_isa; -1 = none chosen). FEDKERNELS_CPU_ISA and set_cpu_isa
// win over it. The gathered linear kernels contract to FMA in the AVX variants (other bits than
// baseline): they keep the process's variant.
std::atomic<int> g_elementwise_choice[2] = {-1, -1};  // [0]: plain, [1]: with a prox
std::atomic<const char*> g_elementwise_source{"detected"};  // "calibrated" or "calibration cache"

Isa elementwise_isa(bool prox) {
  const int chosen = g_elementwise_choice[prox].load(std::memory_order_acquire);
  if (chosen < 0 || g_isa_override.load(std::memory_order_relaxed) >= 0 || std::strcmp(process_isa().source, "detected"))
    return isa();
  return static_cast<Isa>(chosen);
}

}  // namespace

int cpu_threads_for(int64_t n) {
  if (n < kParallelMinElements) return 1;
  const int t = g_num_threads.load(std::memory_order_relaxed);
  return t > 0 ? t : omp_get_max_threads();
}

#if defined(FK_HAVE_X86_VARIANTS)
#define FK_DEFINE_DISPATCH(name, Args, Op, prox)            \
  void name##_cpu(const Launch& L, const Args& a) {         \
    switch (elementwise_isa(prox)) {                        \
      case Isa::kAvx512: return avx512::name(L, a);         \
      case Isa::kAvx2: return avx2::name(L, a);             \
      default: return baseline::name(L, a);                 \
    }                                                       \
  }
#else
#define FK_DEFINE_DISPATCH(name, Args, Op, prox) \
  void name##_cpu(const Launch& L, const Args& a) { return baseline::name(L, a); }
#endif
FK_ELEMENTWISE_OPS(FK_DEFINE_DISPATCH)
FK_DEFINE_DISPATCH(l2_ball_factors, SumSqArgs, unused, false)
FK_DEFINE_DISPATCH(group_lasso_factors, GroupSumSqArgs, unused, false)
#undef FK_DEFINE_DISPATCH

#if defined(FK_HAVE_X86_VARIANTS)
#define FK_DEFINE_GATHER_DISPATCH(name)                 \
  void name##_cpu(const GatherLinearArgs& a) {          \
    switch (isa()) {                                    \
      case Isa::kAvx512: return avx512::name(a);        \
      case Isa::kAvx2: return avx2::name(a);            \
      default: return baseline::name(a);                \
    }                                                   \
  }
#else
#define FK_DEFINE_GATHER_DISPATCH(name) \
  void name##_cpu(const GatherLinearArgs& a) { return baseline::name(a); }
#endif
FK_DEFINE_GATHER_DISPATCH(linear_gathered)
FK_DEFINE_GATHER_DISPATCH(linear_gathered_weight_grad)
#undef FK_DEFINE_GATHER_DISPATCH

std::string cpu_isa() { return isa_name(elementwise_isa(true)); }
std::string cpu_plain_isa() { return isa_name(elementwise_isa(false)); }

std::string cpu_isa_source() {
  if (g_isa_override.load() >= 0) return "set_cpu_isa";
  if (std::strcmp(process_isa().source, "detected") || g_elementwise_choice[1].load() < 0) return process_isa().source;
  return g_elementwise_source.load();
}

std::string cpu_gather_isa() { return isa_name(isa()); }

void cpu_choose_elementwise_isa(const std::string& name, const std::string& plain, const std::string& source) {
  const int chosen = parse_isa(name, "isa"), chosen_plain = parse_isa(plain, "plain");
  if (source != "calibrated" && source != "calibration cache")
    throw std::invalid_argument("source must be 'calibrated' or 'calibration cache', got '" + source + "'");
  g_elementwise_source.store(source == "calibrated" ? "calibrated" : "calibration cache");
  g_elementwise_choice[0].store(chosen_plain, std::memory_order_release);
  g_elementwise_choice[1].store(chosen, std::memory_order_release);
}

std::string cpu_isa_variants() { return usable_variants(); }

void cpu_set_isa(const std::string& name) { g_isa_override.store(parse_isa(name, "isa")); }

void cpu_set_num_threads(int n) { g_num_threads.store(n < 0 ? 0 : n); }
int cpu_thread_limit() { return omp_get_thread_limit(); }
int cpu_get_num_threads() {
  const int t = g_num_threads.load();
  return t > 0 ? t : omp_get_max_threads();
}

std::string cpu_simd_description() {
  if (isa() == Isa::kAvx512) return "avx512 (runtime-selected from avx512, avx2+fma, baseline)";
  if (isa() == Isa::kAvx2) return "avx2+fma (runtime-selected from avx512, avx2+fma, baseline)";
#if defined(__ARM_NEON)
  return "neon";
#elif defined(__SSE2__)
  return "sse2 (baseline x86-64)";
#else
  return "scalar";
#endif
}

}  // namespace fk
