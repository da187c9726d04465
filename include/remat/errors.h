// Errors the runtime raises while executing ops.
//
//   try {
//     auto out = rt.call(matmul, {a, b});
//   } catch (const remat::OutOfMemoryError& e) {
//     std::cerr << e.what();          // names the op, the budget, the request, what was pinned
//     rt.set_budget(e.budget() * 2);  // the runtime is still usable
//   }
//
// Both errors leave the runtime consistent: every tensor that existed before the failing call
// still exists (resident or recomputable) and the failing call produced nothing.
#ifndef REMAT_ERRORS_H_
#define REMAT_ERRORS_H_

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/cuda_api.h"

namespace remat {

// What an out-of-memory error knows about the state it failed in.
// Tensors the program holds handles to, grouped by the op that made them ("constant": made by
// Runtime::constant), as Runtime::held_tensors() and an out-of-memory error report them: what
// keeps memory alive that only the program can let go of.
struct HeldTensors {
  std::string op;
  std::size_t tensors = 0;
  std::size_t bytes = 0;           // of their storages, each counted once
  std::size_t resident_bytes = 0;  // of those in memory now
  std::size_t pinned_bytes = 0;    // of those pinned (constants; tensors frozen by an update)
};

struct OutOfMemoryInfo {
  std::string op;             // the op being run or recomputed ("" outside an op)
  std::size_t requested = 0;  // bytes asked for (after rounding)
  std::size_t budget = 0;     // the hard cap on reserved bytes
  std::size_t reserved = 0;   // reserved bytes when it failed
  std::size_t allocated = 0;  // bytes in live allocations when it failed
  // `allocated` = pinned + locked + kept + untracked, each storage at its allocated
  // (rounded) size (Note [Where the memory went] in runtime/core/execution.cc).
  std::size_t pinned = 0;        // constants and frozen tensors: never evicted
  std::size_t locked = 0;        // unpinned, locked by running ops when eviction gave up
  std::size_t kept = 0;          // neither, but no eviction candidate (recomputed in this request)
  std::size_t untracked = 0;     // in no tensor: a running kernel's scratch, workspaces
  std::size_t largest_free = 0;  // largest free block (0 where memory is counted logically)
  // The reserved segments and the granule they are reserved and split in: what rounding may
  // leave unusable is at most a granule a segment, and one for the request's own.
  std::size_t segments = 0;
  std::size_t granule = 0;
  // Why no block was moved to join the free pieces (a kernel was running, compaction is off,
  // the request's compactions were spent); empty where compaction was tried.
  std::string moves_refused;
  // Non-zero when the segment source (cudaMalloc on CUDA) refused a reservation of this many
  // bytes that the budget had room for: the failure is the device's, below the budget.
  std::size_t source_refused = 0;
  std::string source;  // the segment source's name, where source_refused is set
  // The groups of held tensors with the most resident unpinned bytes (at most 5), by the op
  // that made them: what the program could let go of. Their unpinned bytes may include the
  // inputs the failing op had locked (counted in `locked` too).
  std::vector<HeldTensors> held;
};

class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(OutOfMemoryInfo info);
  const OutOfMemoryInfo& info() const { return info_; }
  std::size_t budget() const { return info_.budget; }
  std::size_t requested() const { return info_.requested; }

 private:
  OutOfMemoryInfo info_;
};

// Raised when recomputation makes no progress: the guard counts recomputations made on behalf
// of one request and gives up past its limit instead of looping forever.
class ThrashError : public std::runtime_error {
 public:
  ThrashError(const std::string& op, std::size_t recomputations, std::size_t limit);
  ThrashError(const std::string& message, std::size_t recomputations)
      : std::runtime_error(message), recomputations_(recomputations) {}
  std::size_t recomputations() const { return recomputations_; }

 private:
  std::size_t recomputations_;
};

// A CUDA call failed with something other than out-of-memory: a kernel that faulted (the
// error is sticky: the context is unusable and every later call fails too), an invalid
// argument, a driver problem. It is raised as it is and never turned into eviction.
class CudaError : public std::runtime_error {
 public:
  // `call` is the CUDA call ("cudaMalloc", "kernel launch"), `op` the op being run ("" outside
  // an op), `device` the device index the runtime was using.
  CudaError(std::string call, int code, std::string cuda_message, std::string op = "",
            int device = -1);
  const std::string& call() const { return call_; }
  int code() const { return code_; }
  const std::string& cuda_message() const { return cuda_message_; }
  const std::string& op() const { return op_; }
  int device() const { return device_; }
  // The same error, naming the op it happened in.
  CudaError in_op(const std::string& op) const {
    return CudaError(call_, code_, cuda_message_, op, device_);
  }
  // Raises `r` as a CudaError of `call` where the call failed; nothing where it succeeded.
  static void check(const CudaResult& r, const char* call, int device = -1,
                    const std::string& op = "") {
    if (!r.ok()) throw CudaError(call, r.code, r.message, op, device);
  }

 private:
  std::string call_;
  int code_;
  std::string cuda_message_;
  std::string op_;
  int device_;
};

}  // namespace remat

#endif  // REMAT_ERRORS_H_
