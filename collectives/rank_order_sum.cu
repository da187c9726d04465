// The local half of a device sum in rank order (Note [Sums in rank order] in
// mpi_collectives.cc): `ranks` slices of `len` floats, one per rank, added in rank order.
#include "collectives/rank_order_sum.h"

namespace remat::detail {
namespace {

__global__ void rank_order_sum_kernel(const float* slices, int ranks, std::size_t len, float scale,
                                      float* out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= len) return;
  float sum = slices[i];
  for (int r = 1; r < ranks; ++r) sum += slices[static_cast<std::size_t>(r) * len + i];
  out[i] = sum * scale;  // times 1: the sum's own bits
}

}  // namespace

cudaError_t launch_rank_order_sum(const float* slices, int ranks, std::size_t len, float scale,
                                  float* out, cudaStream_t stream) {
  if (len == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  const auto blocks = static_cast<unsigned>((len + kThreads - 1) / kThreads);
  rank_order_sum_kernel<<<blocks, kThreads, 0, stream>>>(slices, ranks, len, scale, out);
  return cudaGetLastError();
}

}  // namespace remat::detail
