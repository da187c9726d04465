#include "collectives/nccl_library.h"

#include <dlfcn.h>

#include <string>

// Note [NCCL opened, not linked]
// The trainers link the NCCL engine where the build found NCCL, so that --data-parallel on
// the CUDA backend sums on device memory. Linked, libnccl (200 MB) would be needed to start
// any trainer at all, on every machine with the CUDA runtime: a GPU machine whose toolkit
// has no NCCL could not run even one process. Opened when the engine starts, it is needed
// only there, and its absence is an error that says so.
namespace remat::detail {
namespace {

template <typename Fn>
bool find(void* handle, const char* symbol, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*fn == nullptr) *error += std::string("; no ") + symbol;
  return *fn != nullptr;
}

absl::StatusOr<NcclLibrary> open_nccl() {
  std::string error;
  void* h = nullptr;
  for (const char* name : {REMAT_NCCL_PATH, "libnccl.so.2"}) {
    if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    const char* why = dlerror();
    error +=
        std::string(error.empty() ? "" : "; ") + name + ": " + (why != nullptr ? why : "not found");
  }
  if (h == nullptr) return absl::FailedPreconditionError("NCCL cannot be opened: " + error);
  NcclLibrary n;
  bool ok = find(h, "ncclGetUniqueId", &n.get_unique_id, &error);
  ok &= find(h, "ncclCommInitRank", &n.comm_init_rank, &error);
  ok &= find(h, "ncclCommDestroy", &n.comm_destroy, &error);
  ok &= find(h, "ncclGetErrorString", &n.get_error_string, &error);
  ok &= find(h, "ncclGroupStart", &n.group_start, &error);
  ok &= find(h, "ncclGroupEnd", &n.group_end, &error);
  ok &= find(h, "ncclSend", &n.send, &error);
  ok &= find(h, "ncclRecv", &n.recv, &error);
  ok &= find(h, "ncclAllGather", &n.all_gather, &error);
  if (!ok) return absl::FailedPreconditionError("NCCL lacks what remat calls" + error);
  return n;
}

}  // namespace

absl::StatusOr<const NcclLibrary*> nccl_library() {
  static const absl::StatusOr<NcclLibrary> library = open_nccl();
  if (!library.ok()) return library.status();
  return &*library;
}

}  // namespace remat::detail
