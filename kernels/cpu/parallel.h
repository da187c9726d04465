// Threads for the CPU kernels that are not GEMMs (elementwise ops, row-wise normalisations,
// the optimizer), which would otherwise run on one core beside OpenBLAS's threads.
//
//   parallel_for(n, /*grain=*/1 << 14, [&](i64 begin, i64 end) {
//     for (i64 i = begin; i < end; ++i) y[i] = f(x[i]);
//   });
#ifndef REMAT_KERNELS_CPU_PARALLEL_H_
#define REMAT_KERNELS_CPU_PARALLEL_H_

#include <cstdint>

namespace remat::kernels::cpu {

// Threads the kernels use: REMAT_CPU_THREADS, else OPENBLAS_NUM_THREADS, else the hardware's;
// between 1 and 16. Read once.
int cpu_threads();

namespace detail {
using ChunkFn = void (*)(const void* ctx, std::int64_t begin, std::int64_t end);
void parallel_for(std::int64_t n, std::int64_t grain, std::int64_t align, ChunkFn fn,
                  const void* ctx);
}  // namespace detail

// Note [Deterministic threading]
// Runs body(begin, end) over [0, n) in at most cpu_threads() contiguous chunks of at least
// `grain` items, chunk boundaries multiples of `align`; the caller runs the first chunk. Only
// for loops whose items are independent (each output written from its own inputs, in the
// same order whichever thread runs it): the result is then the same bits for any number of
// threads, which is what keeps a recomputation bitwise equal to the first run. A reduction
// across items stays on one thread. A call made while another is running (a second runtime
// on another thread) runs on the calling thread alone.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body, std::int64_t align = 1) {
  detail::parallel_for(
      n, grain, align,
      [](const void* ctx, std::int64_t begin, std::int64_t end) {
        (*static_cast<const Body*>(ctx))(begin, end);
      },
      &body);
}

}  // namespace remat::kernels::cpu

#endif  // REMAT_KERNELS_CPU_PARALLEL_H_
