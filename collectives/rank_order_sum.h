// out[i] = (slices[0][i] + slices[1][i] + ...) * scale, in rank order, on the device
// (rank_order_sum.cu).
#ifndef REMAT_COLLECTIVES_RANK_ORDER_SUM_H_
#define REMAT_COLLECTIVES_RANK_ORDER_SUM_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace remat::detail {

// `slices` holds `ranks` slices of `len` floats, rank 0's first; `out` gets their sum times
// `scale` (`out` may be `slices` where ranks is 1).
cudaError_t launch_rank_order_sum(const float* slices, int ranks, std::size_t len, float scale,
                                  float* out, cudaStream_t stream);

}  // namespace remat::detail

#endif  // REMAT_COLLECTIVES_RANK_ORDER_SUM_H_
