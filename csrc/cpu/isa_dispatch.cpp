// Runtime choice of the CPU kernel variant, and CPU threading settings.
#include <omp.h>

#include <atomic>
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

// Tests force a variant (_C.set_cpu_isa) to check that every variant gives the same bits; -1 =
// the detected one.
std::atomic<int> g_isa_override{-1};

Isa isa() {
  static const Isa chosen = detect_isa();
  const int forced = g_isa_override.load(std::memory_order_relaxed);
  return forced < 0 ? chosen : static_cast<Isa>(forced);
}

const char* isa_name(Isa i) {
  return i == Isa::kAvx512 ? "avx512" : (i == Isa::kAvx2 ? "avx2" : "baseline");
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
    switch (isa()) {                                        \
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

std::string cpu_isa() { return isa_name(isa()); }

std::string cpu_isa_variants() {
  const Isa best = detect_isa();
  std::string out = "baseline";
  if (best == Isa::kAvx2 || best == Isa::kAvx512) out += ",avx2";
  if (best == Isa::kAvx512) out += ",avx512";
  return out;
}

void cpu_set_isa(const std::string& name) {
  if (name == "auto") {
    g_isa_override.store(-1);
    return;
  }
  const std::string usable = "," + cpu_isa_variants() + ",";
  if (usable.find("," + name + ",") == std::string::npos)
    throw std::invalid_argument("isa must be 'auto' or one this CPU runs (" + cpu_isa_variants() +
                                "), got '" + name + "'");
  g_isa_override.store(name == "avx512" ? static_cast<int>(Isa::kAvx512)
                                        : (name == "avx2" ? static_cast<int>(Isa::kAvx2)
                                                          : static_cast<int>(Isa::kBaseline)));
}

void cpu_set_num_threads(int n) { g_num_threads.store(n < 0 ? 0 : n); }
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
