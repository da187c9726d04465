// The device collectives over NCCL (remat/nccl_collectives.h). A sum in rank order (Note
// [Sums in rank order] in mpi_collectives.cc) is an exchange of slices (grouped ncclSend and
// ncclRecv: rank r gets every rank's r-th slice), a kernel adding them in rank order, and an
// exchange of the summed slices; ncclAllReduce would add in an order of NCCL's choosing.
// NCCL is opened at run time (Note [NCCL opened, not linked] in nccl_library.cc).
#include "remat/nccl_collectives.h"

#include <absl/strings/str_cat.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <span>

#include "collectives/nccl_library.h"
#include "collectives/rank_order_sum.h"

namespace remat {
namespace {

absl::Status nccl_status(const detail::NcclLibrary& nccl, ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ", nccl.get_error_string(rc)));
}

absl::Status cuda_status(cudaError_t rc, const char* call) {
  if (rc == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorString(rc)));
}

class Nccl final : public DeviceCollectives {
 public:
  Nccl(const detail::NcclLibrary& nccl, ncclComm_t comm, int rank, int size)
      : nccl_(nccl), comm_(comm), rank_(rank), size_(size) {}
  ~Nccl() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    nccl_.comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status all_reduce_sum(float* data, std::size_t n, float scale, void* stream,
                              std::span<float> scratch) override;
  // Rank r's slice of every rank's buffer, in rank order: asked for as the longest slice on
  // every rank, so that ranks lay their memory out alike (Note [Ranks that agree]).
  std::size_t sum_scratch_floats(std::size_t n) const override {
    const auto ranks = static_cast<std::size_t>(size_);
    return size_ == 1 ? 0 : (n + ranks - 1) / ranks * ranks;
  }
  absl::Status all_gather(const float* mine, std::size_t n, float* all, void* stream) override {
    return nccl_status(nccl_, nccl_.all_gather(mine, all, n, ncclFloat, comm_, as_stream(stream)),
                       "ncclAllGather");
  }

 private:
  static cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
  std::size_t begin(std::size_t n, int r) const { return slice_begin(n, r, size_); }
  absl::Status reserve_scratch(std::size_t floats);
  // Rank r's slice of every rank's `data` into `scratch` (rank order), and back.
  absl::Status exchange_slices(float* data, std::size_t n, float* scratch, cudaStream_t stream);
  absl::Status gather_sums(float* data, std::size_t n, cudaStream_t stream);

  const detail::NcclLibrary& nccl_;
  ncclComm_t comm_;
  int rank_, size_;
  float* scratch_ = nullptr;  // outside any budget: where callers pass no scratch
  std::size_t scratch_floats_ = 0;
};

absl::Status Nccl::reserve_scratch(std::size_t floats) {
  if (floats <= scratch_floats_) return absl::OkStatus();
  if (scratch_ != nullptr) cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_floats_ = 0;
  void* p = nullptr;
  if (absl::Status st = cuda_status(cudaMalloc(&p, floats * sizeof(float)), "cudaMalloc"); !st.ok())
    return st;
  scratch_ = static_cast<float*>(p);
  scratch_floats_ = floats;
  return absl::OkStatus();
}

absl::Status Nccl::exchange_slices(float* data, std::size_t n, float* scratch,
                                   cudaStream_t stream) {
  const std::size_t mine = begin(n, rank_ + 1) - begin(n, rank_);
  if (absl::Status st = nccl_status(nccl_, nccl_.group_start(), "ncclGroupStart"); !st.ok())
    return st;
  for (int r = 0; r < size_; ++r) {
    const std::size_t len = begin(n, r + 1) - begin(n, r);
    nccl_.send(data + begin(n, r), len, ncclFloat, r, comm_, stream);
    nccl_.recv(scratch + static_cast<std::size_t>(r) * mine, mine, ncclFloat, r, comm_, stream);
  }
  return nccl_status(nccl_, nccl_.group_end(), "ncclGroupEnd (exchanging slices)");
}

absl::Status Nccl::gather_sums(float* data, std::size_t n, cudaStream_t stream) {
  const std::size_t at = begin(n, rank_), mine = begin(n, rank_ + 1) - at;
  if (absl::Status st = nccl_status(nccl_, nccl_.group_start(), "ncclGroupStart"); !st.ok())
    return st;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    nccl_.send(data + at, mine, ncclFloat, r, comm_, stream);
    nccl_.recv(data + begin(n, r), begin(n, r + 1) - begin(n, r), ncclFloat, r, comm_, stream);
  }
  return nccl_status(nccl_, nccl_.group_end(), "ncclGroupEnd (gathering sums)");
}

// A rank whose kernel launch fails still makes the gather its peers wait in, and returns the
// launch's error after it. Scratch the caller passes (a gradient bucket's, within its
// budget) cannot fail; the engine's own scratch can, and returns at once: a caller with
// several ranks passes scratch.
absl::Status Nccl::all_reduce_sum(float* data, std::size_t n, float scale, void* stream_ptr,
                                  std::span<float> scratch) {
  const cudaStream_t stream = as_stream(stream_ptr);
  if (n == 0 || (size_ == 1 && scale == 1.0f)) return absl::OkStatus();
  if (size_ == 1)
    return cuda_status(detail::launch_rank_order_sum(data, 1, n, scale, data, stream),
                       "rank_order_sum kernel launch");
  const std::size_t at = begin(n, rank_), mine = begin(n, rank_ + 1) - at;
  float* work = scratch.data();
  if (scratch.size() < sum_scratch_floats(n)) {
    if (absl::Status st = reserve_scratch(sum_scratch_floats(n)); !st.ok()) return st;
    work = scratch_;
  }
  if (absl::Status st = exchange_slices(data, n, work, stream); !st.ok()) return st;
  const absl::Status launched =
      cuda_status(detail::launch_rank_order_sum(work, size_, mine, scale, data + at, stream),
                  "rank_order_sum kernel launch");
  const absl::Status gathered = gather_sums(data, n, stream);
  return launched.ok() ? gathered : launched;
}

// Every rank learns whether any failed before the next exchange: a rank that returned alone
// would leave the others waiting in it.
absl::Status agreed(Collectives& bootstrap, const absl::Status& local) {
  absl::StatusOr<std::int64_t> any = bootstrap.all_max(local.ok() ? 0 : 1);
  if (!any.ok()) return any.status();
  if (!local.ok()) return local;
  if (*any != 0) return absl::AbortedError("nccl_collectives: another rank failed to start");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCollectives>> nccl_collectives(Collectives& bootstrap,
                                                                    int device) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  absl::StatusOr<const detail::NcclLibrary*> nccl = detail::nccl_library();
  absl::Status local = nccl.status();
  if (local.ok()) local = cuda_status(cudaSetDevice(device), "cudaSetDevice");
  if (local.ok() && bootstrap.rank() == 0)
    local = nccl_status(**nccl, (*nccl)->get_unique_id(&id), "ncclGetUniqueId");
  if (absl::Status st = agreed(bootstrap, local); !st.ok()) return st;
  if (absl::Status st = bootstrap.broadcast(
          std::as_writable_bytes(std::span(reinterpret_cast<char*>(&id), sizeof(id))), 0);
      !st.ok())
    return st;
  ncclComm_t comm = nullptr;
  if (absl::Status st = nccl_status(
          **nccl, (*nccl)->comm_init_rank(&comm, bootstrap.size(), id, bootstrap.rank()),
          "ncclCommInitRank");
      !st.ok())
    return st;
  return std::unique_ptr<DeviceCollectives>(
      std::make_unique<Nccl>(**nccl, comm, bootstrap.rank(), bootstrap.size()));
}

}  // namespace remat
