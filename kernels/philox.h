// Philox4x32-10, a counter-based random number generator (Salmon et al., SC'11): the numbers
// are a pure function of (key, counter), so an op that records the counter it started from
// draws exactly the same numbers when it is recomputed. Usable from host and device code,
// with the same bits on both (CPU and CUDA dropout masks agree).
//
//   remat::Philox rng(/*seed=*/42, /*offset=*/ctx.rng.offset);
//   float u = rng.uniform(i);   // the i-th number of this op's stream
#ifndef REMAT_KERNELS_PHILOX_H_
#define REMAT_KERNELS_PHILOX_H_

#include <cstdint>

#if defined(__CUDACC__)
#define REMAT_HOST_DEVICE __host__ __device__
#else
#define REMAT_HOST_DEVICE
#endif

namespace remat {

struct PhiloxBlock {
  std::uint32_t w[4];
};

class Philox {
 public:
  REMAT_HOST_DEVICE Philox(std::uint64_t seed, std::uint64_t offset)
      : seed_(seed), offset_(offset) {}

  // Four 32-bit words for block `index` of this stream.
  REMAT_HOST_DEVICE PhiloxBlock block(std::uint64_t index) const {
    const std::uint64_t counter = offset_ + index;
    std::uint32_t c0 = static_cast<std::uint32_t>(counter);
    std::uint32_t c1 = static_cast<std::uint32_t>(counter >> 32);
    std::uint32_t c2 = 0, c3 = 0;
    std::uint32_t k0 = static_cast<std::uint32_t>(seed_);
    std::uint32_t k1 = static_cast<std::uint32_t>(seed_ >> 32);
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c0;
      const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * c2;
      const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
      const std::uint32_t n1 = static_cast<std::uint32_t>(p1);
      const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
      const std::uint32_t n3 = static_cast<std::uint32_t>(p0);
      c0 = n0;
      c1 = n1;
      c2 = n2;
      c3 = n3;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return PhiloxBlock{{c0, c1, c2, c3}};
  }

  // A float in [0, 1) for element `i` of the stream (four elements per block).
  REMAT_HOST_DEVICE float uniform(std::uint64_t i) const {
    const std::uint32_t word = block(i / 4).w[i % 4];
    return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_;
};

}  // namespace remat

#endif  // REMAT_KERNELS_PHILOX_H_
