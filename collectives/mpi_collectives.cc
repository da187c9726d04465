// The collectives over MPI (remat/mpi_collectives.h).
//
// Note [Sums in rank order]
// MPI_Allreduce may add the ranks' values in any order, and a float sum depends on it. So
// all_reduce_sum is a reduce-scatter and an all-gather of our own making from MPI's
// all-to-all and all-gather: rank r receives every rank's r-th slice of the buffer, adds
// them in rank order, and the summed slices are gathered back. Each element is then
// ((x0 + x1) + x2) + ... on every rank, for any number of ranks, and one process that adds
// the ranks' buffers in rank order gets the same bits. The traffic is that of a ring
// all-reduce: each rank sends and receives about twice the buffer.
#include "remat/mpi_collectives.h"

#include <absl/strings/str_cat.h>
#include <mpi.h>

#include <climits>
#include <vector>

namespace remat {
namespace {

absl::Status mpi_status(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return absl::InternalError(absl::StrCat(call, " failed: ", std::string(text, len)));
}

absl::Status check_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", n, " values exceed MPI's counts (at most ", INT_MAX, ")"));
  return absl::OkStatus();
}

class Mpi final : public Collectives {
 public:
  Mpi(MPI_Comm comm, bool finalize) : comm_(comm), finalize_(finalize) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~Mpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);  // the caller may have finalized the MPI it started
    if (finalized) return;
    MPI_Comm_free(&comm_);
    if (finalize_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "mpi"; }

  absl::Status all_reduce_sum(std::span<float> data) override;
  absl::Status all_gather(std::span<const float> mine, std::span<float> all) override {
    if (absl::Status st = check_all_gather(mine.size(), all.size(), size_); !st.ok()) return st;
    if (absl::Status st = check_count(all.size(), "all_gather"); !st.ok()) return st;
    return mpi_status(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT,
                                    all.data(), static_cast<int>(mine.size()), MPI_FLOAT, comm_),
                      "MPI_Allgather");
  }
  absl::Status broadcast(std::span<std::byte> data, int root) override {
    if (absl::Status st = check_root(root, size_); !st.ok()) return st;
    for (std::size_t at = 0; at < data.size(); at += INT_MAX) {
      const std::size_t n = std::min<std::size_t>(INT_MAX, data.size() - at);
      if (absl::Status st = mpi_status(
              MPI_Bcast(data.data() + at, static_cast<int>(n), MPI_BYTE, root, comm_), "MPI_Bcast");
          !st.ok())
        return st;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::int64_t> all_max(std::int64_t value) override {
    std::int64_t out = 0;
    if (absl::Status st = mpi_status(MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, comm_),
                                     "MPI_Allreduce");
        !st.ok())
      return st;
    return out;
  }

 private:
  // Rank r's slice of n values: [begin(r), begin(r + 1)) (MPI counts them in ints).
  int begin(std::size_t n, int r) const { return static_cast<int>(slice_begin(n, r, size_)); }

  MPI_Comm comm_;
  bool finalize_;
  int rank_ = 0, size_ = 1;
};

// Note [Sums in rank order].
absl::Status Mpi::all_reduce_sum(std::span<float> data) {
  if (size_ == 1) return absl::OkStatus();
  if (absl::Status st = check_count(data.size(), "all_reduce_sum"); !st.ok()) return st;
  const std::size_t n = data.size();
  const int mine = begin(n, rank_ + 1) - begin(n, rank_);
  std::vector<int> send_counts(size_), send_at(size_), recv_counts(size_), recv_at(size_);
  for (int r = 0; r < size_; ++r) {
    send_counts[r] = begin(n, r + 1) - begin(n, r);
    send_at[r] = begin(n, r);
    recv_counts[r] = mine;
    recv_at[r] = r * mine;
  }
  std::vector<float> slices(static_cast<std::size_t>(mine) * static_cast<std::size_t>(size_));
  if (absl::Status st = mpi_status(
          MPI_Alltoallv(data.data(), send_counts.data(), send_at.data(), MPI_FLOAT, slices.data(),
                        recv_counts.data(), recv_at.data(), MPI_FLOAT, comm_),
          "MPI_Alltoallv");
      !st.ok())
    return st;
  std::vector<float> sum(slices.begin(), slices.begin() + mine);
  for (int r = 1; r < size_; ++r)
    for (int i = 0; i < mine; ++i) sum[i] += slices[static_cast<std::size_t>(r * mine + i)];
  return mpi_status(MPI_Allgatherv(sum.data(), mine, MPI_FLOAT, data.data(), send_counts.data(),
                                   send_at.data(), MPI_FLOAT, comm_),
                    "MPI_Allgatherv");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> mpi_collectives(int* argc, char*** argv) {
  int up = 0;
  MPI_Initialized(&up);
  int provided = 0;
  if (!up) {
    // Serialized: a step's gradient buckets are summed on a thread of their own, beside the
    // backward pass (Note [Buckets beside the backward pass] in driver/gradient_buckets.cc).
    if (absl::Status st = mpi_status(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided),
                                     "MPI_Init_thread");
        !st.ok())
      return st;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return absl::FailedPreconditionError(
        "MPI gives no MPI_THREAD_SERIALIZED (calls from any one thread at a time), which the "
        "collectives need: initialize it with MPI_Init_thread asking for it");
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (absl::Status st = mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup"); !st.ok())
    return st;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<Collectives>(std::make_unique<Mpi>(comm, /*finalize=*/!up));
}

}  // namespace remat
