// Philox4x32-10, a counter-based random number generator (Salmon et al., SC'11): the numbers
// are a pure function of (key, counter), so an op that records the counter it started from
// draws exactly the same numbers when it is recomputed.
//
//   remat::Philox rng(/*seed=*/42, /*offset=*/ctx.rng.offset);
//   float u = rng.uniform(i);   // the i-th number of this op's stream
#ifndef REMAT_KERNELS_PHILOX_H_
#define REMAT_KERNELS_PHILOX_H_

#include <array>
#include <cstdint>

namespace remat {

class Philox {
 public:
  Philox(std::uint64_t seed, std::uint64_t offset) : seed_(seed), offset_(offset) {}

  // Four 32-bit words for block `index` of this stream.
  std::array<std::uint32_t, 4> block(std::uint64_t index) const {
    const std::uint64_t counter = offset_ + index;
    std::array<std::uint32_t, 4> c = {static_cast<std::uint32_t>(counter),
                                      static_cast<std::uint32_t>(counter >> 32), 0u, 0u};
    std::array<std::uint32_t, 2> k = {static_cast<std::uint32_t>(seed_),
                                      static_cast<std::uint32_t>(seed_ >> 32)};
    for (int round = 0; round < 10; ++round) {
      const std::uint64_t p0 = std::uint64_t{0xD2511F53u} * c[0];
      const std::uint64_t p1 = std::uint64_t{0xCD9E8D57u} * c[2];
      c = {static_cast<std::uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<std::uint32_t>(p1),
           static_cast<std::uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<std::uint32_t>(p0)};
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    return c;
  }

  // A float in [0, 1) for element `i` of the stream (four elements per block).
  float uniform(std::uint64_t i) const {
    const std::uint32_t word = block(i / 4)[i % 4];
    return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
  }

 private:
  std::uint64_t seed_;
  std::uint64_t offset_;
};

}  // namespace remat

#endif  // REMAT_KERNELS_PHILOX_H_
