#include "remat/errors.h"

#include <absl/strings/str_cat.h>

namespace remat {
namespace {

// Who holds the allocated bytes: what keeps them from being evicted, and the program's
// handles.
std::string holders(const OutOfMemoryInfo& i) {
  std::string out = absl::StrCat("; allocated ", i.allocated, " = pinned ", i.pinned,
                                 " + locked by running ops ", i.locked);
  if (i.kept > 0) absl::StrAppend(&out, " + kept (recomputed in this request) ", i.kept);
  if (i.untracked > 0) absl::StrAppend(&out, " + kernel scratch and workspace ", i.untracked);
  // Free budget that could not serve the request: fragmentation, not a lack of bytes.
  if (i.reserved > i.allocated && i.largest_free < i.requested)
    absl::StrAppend(&out, "; free: ", i.reserved - i.allocated,
                    " reserved bytes in pieces of at most ", i.largest_free, " and ",
                    i.budget > i.reserved ? i.budget - i.reserved : 0, " unreserved, ",
                    i.moves_refused.empty()
                        ? "which no move of the blocks between them could join"
                        : absl::StrCat("not joined: no block moved, since ", i.moves_refused));
  if (i.held.empty()) return out;
  absl::StrAppend(&out, "; resident unpinned tensors the program holds:");
  for (std::size_t g = 0; g < i.held.size(); ++g)
    absl::StrAppend(&out, g == 0 ? " " : ", ", i.held[g].tensors, " from '", i.held[g].op, "' (",
                    i.held[g].resident_bytes - i.held[g].pinned_bytes, " bytes)");
  return out;
}

std::string describe(const OutOfMemoryInfo& i) {
  return absl::StrCat(
      "remat: out of memory", i.op.empty() ? "" : absl::StrCat(" in op '", i.op, "'"),
      ": requested ", i.requested, " bytes under a budget of ", i.budget, " bytes (reserved ",
      i.reserved,
      i.segments == 0
          ? ""
          : absl::StrCat(" in ", i.segments, " segments of ", i.granule, "-byte granules"),
      ", largest free block ", i.largest_free, ")", holders(i),
      i.source_refused == 0
          ? ""
          : absl::StrCat("; the ", i.source, " source refused a reservation of ", i.source_refused,
                         " bytes below the budget (the device has less free "
                         "memory than the budget assumes)"));
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(OutOfMemoryInfo info)
    : std::runtime_error(describe(info)), info_(std::move(info)) {}

ThrashError::ThrashError(const std::string& op, std::size_t recomputations, std::size_t limit)
    : std::runtime_error(absl::StrCat("remat: thrashing while materializing op '", op, "': ",
                                      recomputations, " recomputations for one request (limit ",
                                      limit, "); the budget is too small to make progress")),
      recomputations_(recomputations) {}

CudaError::CudaError(std::string call, int code, std::string cuda_message, std::string op,
                     int device)
    : std::runtime_error(absl::StrCat("remat: CUDA error", op.empty() ? "" : " in op '", op,
                                      op.empty() ? "" : "'",
                                      device < 0 ? "" : absl::StrCat(" on device ", device), ": ",
                                      call, " returned ", code, " (", cuda_message, ")")),
      call_(std::move(call)),
      code_(code),
      cuda_message_(std::move(cuda_message)),
      op_(std::move(op)),
      device_(device) {}

}  // namespace remat
