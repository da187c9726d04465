// Portable deterministic numbers for initialising parameters and drawing data: the same
// (seed, stream) gives the same values on every machine and standard library.
#ifndef REMAT_EXAMPLES_COMMON_RANDOM_H_
#define REMAT_EXAMPLES_COMMON_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <vector>

namespace remat::examples {

class SplitMix {
 public:
  SplitMix(std::uint64_t seed, std::uint64_t stream = 0)
      : state_(seed * 0x9E3779B97F4A7C15ULL + stream * 0xD1B54A32D192ED03ULL + 1) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  // Box-Muller; one value per call keeps the sequence simple.
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

inline std::vector<float> normal_values(std::int64_t n, float stddev, SplitMix& rng) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.normal() * stddev);
  return v;
}
inline std::vector<float> constant_values(std::int64_t n, float value) {
  return std::vector<float>(static_cast<std::size_t>(n), value);
}

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_RANDOM_H_
