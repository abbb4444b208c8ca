// Stand-ins for the CUDA entry points in a CPU-only build (no CUDA compiler found, or
// FEDKERNELS_CPU_ONLY=1). Python never routes a CUDA tensor here without checking
// backend_info()["cuda_compiled"]; these throw in case something does.
#include <stdexcept>
#include <string>

#include "../dispatch.h"

namespace fk {
namespace {
[[noreturn]] void no_cuda() {
  throw std::runtime_error("fedkernels was built without CUDA support (CPU-only build)");
}
}  // namespace

#define FK_DEFINE_NO_CUDA(name, Args, Op, prox) \
  void name##_cuda(const Launch&, const Args&) { no_cuda(); }
FK_ELEMENTWISE_OPS(FK_DEFINE_NO_CUDA)
#undef FK_DEFINE_NO_CUDA
void l2_ball_factors_cuda(const Launch&, const SumSqArgs&) { no_cuda(); }
void group_lasso_factors_cuda(const Launch&, const GroupSumSqArgs&) { no_cuda(); }

bool cuda_compiled() { return false; }
std::string cuda_archs() { return ""; }
int cuda_device_count(std::string* error) {
  if (error) *error = "fedkernels was built without CUDA support";
  return 0;
}
std::string cuda_runtime_version() { return ""; }

}  // namespace fk
