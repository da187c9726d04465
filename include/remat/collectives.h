// remat/collectives.h: what data-parallel training needs of the processes it runs in: this
// process's rank, how many there are, and collectives over host buffers that give every rank
// the same bits. Engines: one process alone (single_process_collectives(), here), and MPI
// (remat/mpi_collectives.h, component `mpi`, for processes started by mpirun).
//
//   std::unique_ptr<remat::Collectives> c = remat::single_process_collectives();
//   std::vector<float> grad = {1.0f, 2.0f};
//   absl::Status st = c->all_reduce_sum(grad);              // the ranks' sum, on every rank
//   absl::StatusOr<std::int64_t> worst = c->all_max(0);     // agreeing on one outcome
//   if (st.ok() && worst.ok() && *worst == 0) { /* every rank's step went through */ }
//
// Every rank must make the same calls in the same order with the same sizes, as with MPI;
// a size that differs is an error where the engine can tell, a hang where it cannot. Calls
// may come from any thread, one at a time (a step's gradient buckets are summed on a thread
// of their own: remat/gradient_buckets.h).
#ifndef REMAT_COLLECTIVES_H_
#define REMAT_COLLECTIVES_H_

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace remat {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;  // 0 .. size() - 1
  virtual int size() const = 0;
  virtual std::string engine() const = 0;  // "single process", "mpi"

  // Sums `data` over the ranks, element by element, in place. Each element is summed in rank
  // order, ((x0 + x1) + x2) + ..., whatever the engine's algorithm, so every rank gets the
  // same bits, and the bits one process gets adding the ranks' buffers in that order.
  virtual absl::Status all_reduce_sum(std::span<float> data) = 0;
  // `mine` from every rank (the same length on all), in rank order: `all` holds size() times
  // as many values.
  virtual absl::Status all_gather(std::span<const float> mine, std::span<float> all) = 0;
  // Rank `root`'s `data` on every rank.
  virtual absl::Status broadcast(std::span<std::byte> data, int root) = 0;
  // The largest of the ranks' values: how ranks agree on one outcome (a step that failed on
  // one rank fails on all).
  virtual absl::StatusOr<std::int64_t> all_max(std::int64_t value) = 0;
};

// Collectives over device memory (an engine: remat/nccl_collectives.h). The calls enqueue
// work on the given stream and return.
class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sums the `n` floats at `data` (device memory) over the ranks, in place, each element in
  // rank order, then multiplies each sum by `scale` (1: the sum itself; 1 / ranks: the
  // mean), on `stream` (a cudaStream_t; null: the default stream). The engine works in
  // `scratch` (device memory, free until the sum ends on `stream`) where it holds
  // sum_scratch_floats(n); with less, in memory of its own, outside any budget.
  virtual absl::Status all_reduce_sum(float* data, std::size_t n, float scale, void* stream,
                                      std::span<float> scratch) = 0;
  virtual std::size_t sum_scratch_floats(std::size_t n) const = 0;
  // Every rank's `n` floats at `mine` into `all` (size() * n), in rank order, on `stream`.
  virtual absl::Status all_gather(const float* mine, std::size_t n, float* all, void* stream) = 0;
};

// Where rank `rank`'s slice of `n` values split over `ranks` begins: the slice is
// [slice_begin(n, rank, ranks), slice_begin(n, rank + 1, ranks)), the slices in rank order,
// their sizes within one of each other. The engines' sums exchange such slices; a buffer
// split over the ranks (optimizer state in shards) can be cut the same way.
inline std::size_t slice_begin(std::size_t n, int rank, int ranks) {
  return n * static_cast<std::size_t>(rank) / static_cast<std::size_t>(ranks);
}

// One process, rank 0 of 1: the collectives copy or do nothing.
std::unique_ptr<Collectives> single_process_collectives();

// Checks what the collectives' callers pass that can be checked alone: that `all` holds
// `ranks` times `mine`, and `root` is a rank. Engines call them first.
absl::Status check_all_gather(std::size_t mine, std::size_t all, int ranks);
absl::Status check_root(int root, int ranks);

}  // namespace remat

#endif  // REMAT_COLLECTIVES_H_
