// CUDA kernels for the prox and the proximal gradient step.
#include "launch.cuh"

namespace fk {

FK_PROX_OPS(FK_DEFINE_CUDA)

}  // namespace fk
