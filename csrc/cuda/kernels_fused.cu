// CUDA kernels for the fused federated updates that end in a prox (FedNMap, ZA1, DEPOSITUM).
#include "launch.cuh"

namespace fk {

FK_FUSED_PROX_OPS(FK_DEFINE_CUDA)

}  // namespace fk
