// exp over 4 floats at once, for the CPU kernels' elementwise loops (GELU, softmax), where
// the C library's scalar expf/tanhf cost more than the rest of the loop.
//
//   for (i64 i = 0; i < n; i += 4) {
//     Float4 x = load4(in + i, n - i);
//     store4(out + i, exp4(x), n - i);
//   }
//
// Note [Vector exp]
// exp(x) = 2^k * exp(r) with k = round(x / ln 2) and r = x - k ln 2 in [-ln2/2, ln2/2]; exp(r)
// is its Taylor polynomial of degree 7 (truncation below 1e-8 relative there), 2^k is built
// in the exponent bits. Arguments are clamped to [-87, 88], where 2^k stays a normal float:
// below, the result is about 1.6e-38 instead of 0 or a denormal, above about 1.65e38
// instead of inf. The error is within a few ulp of expf (exp_test.cc checks 4 ulp).
//
// Written with GCC/Clang vector extensions of 16 bytes, so that the compiler emits SSE2 on
// any x86-64 and NEON on ARM without intrinsics per target (32 bytes would change the ABI
// of these functions between builds with and without AVX). Every
// element goes through the same operations whichever lane or call it lands in: a loop's
// tail is padded to 4 rather than done by a scalar twin that a compiler could contract
// differently (FMA), so that a value's bits do not depend on where a chunk starts (Note
// [Deterministic threading] in parallel.h).
#ifndef REMAT_KERNELS_CPU_VECTOR_EXP_H_
#define REMAT_KERNELS_CPU_VECTOR_EXP_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace remat::kernels::cpu {

typedef float Float4 __attribute__((vector_size(16)));
typedef std::int32_t Int4 __attribute__((vector_size(16)));

inline Float4 splat4(float v) { return Float4{} + v; }

// The first min(n, 4) floats at p, the rest 0.
inline Float4 load4(const float* p, std::int64_t n) {
  Float4 v{};
  if (n >= 4)
    std::memcpy(&v, p, sizeof(v));
  else if (n > 0)
    std::memcpy(&v, p, sizeof(float) * static_cast<std::size_t>(n));
  return v;
}

// Writes the first min(n, 4) lanes of v to p.
inline void store4(float* p, Float4 v, std::int64_t n) {
  if (n >= 4)
    std::memcpy(p, &v, sizeof(v));
  else if (n > 0)
    std::memcpy(p, &v, sizeof(float) * static_cast<std::size_t>(n));
}

inline Float4 min4(Float4 a, Float4 b) { return a < b ? a : b; }
inline Float4 max4(Float4 a, Float4 b) { return a > b ? a : b; }

inline Float4 exp4(Float4 x) {
  x = min4(max4(x, splat4(-87.0f)), splat4(88.0f));
  // Round to nearest by adding and subtracting 1.5 * 2^23 (|x / ln 2| < 2^22).
  const Float4 shifter = splat4(12582912.0f);
  const Float4 k = (x * splat4(1.44269504088896341f) + shifter) - shifter;
  // ln 2 in two parts, so that k * ln2_hi is exact and r keeps its low bits.
  const Float4 r = (x - k * splat4(0.693359375f)) - k * splat4(-2.12194440e-4f);
  Float4 p = splat4(1.0f / 5040);
  p = p * r + splat4(1.0f / 720);
  p = p * r + splat4(1.0f / 120);
  p = p * r + splat4(1.0f / 24);
  p = p * r + splat4(1.0f / 6);
  p = p * r + splat4(0.5f);
  p = p * r + splat4(1.0f);
  p = p * r + splat4(1.0f);
  const Int4 bits = (__builtin_convertvector(k, Int4) + 127) << 23;
  Float4 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace remat::kernels::cpu

#endif  // REMAT_KERNELS_CPU_VECTOR_EXP_H_
