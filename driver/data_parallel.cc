#include "remat/data_parallel.h"

#include <absl/strings/str_cat.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/errors.h"

namespace remat {

Tensor all_reduce_sum(Runtime& rt, Collectives& collectives, const Tensor& t) {
  const TensorSpec spec = t.spec();
  if (rt.options().backend == Backend::kSimulated) return rt.constant(spec, nullptr);
  if (spec.dtype != DType::kF32)
    throw std::invalid_argument("all_reduce_sum: only float32 tensors are summed across ranks");
  std::vector<float> host(static_cast<std::size_t>(spec.numel()));
  rt.read(t, host.data());
  if (absl::Status st = collectives.all_reduce_sum(host); !st.ok())
    throw std::runtime_error(
        absl::StrCat("rank ", collectives.rank(), " of ", collectives.size(), ": ", st.message()));
  return rt.constant(spec, host.data());
}

}  // namespace remat

namespace remat {
namespace {

// What the first failing rank sends the others (Note [Ranks that agree]).
struct FailureHeader {
  std::int64_t kind = 0;  // 1 out of memory, 2 thrash, 3 anything else
  std::int64_t requested = 0, budget = 0, reserved = 0, allocated = 0, pinned = 0, locked = 0;
  std::int64_t recomputations = 0;
  std::int64_t op_bytes = 0, message_bytes = 0;
};

FailureHeader describe(std::exception_ptr failure, std::string& op, std::string& message) {
  FailureHeader h;
  try {
    std::rethrow_exception(failure);
  } catch (const OutOfMemoryError& e) {
    const OutOfMemoryInfo& i = e.info();
    h = {.kind = 1,
         .requested = static_cast<std::int64_t>(i.requested),
         .budget = static_cast<std::int64_t>(i.budget),
         .reserved = static_cast<std::int64_t>(i.reserved),
         .allocated = static_cast<std::int64_t>(i.allocated),
         .pinned = static_cast<std::int64_t>(i.pinned),
         .locked = static_cast<std::int64_t>(i.locked)};
    op = i.op;
    message = e.what();
  } catch (const ThrashError& e) {
    h.kind = 2;
    h.recomputations = static_cast<std::int64_t>(e.recomputations());
    message = e.what();
  } catch (const std::exception& e) {
    h.kind = 3;
    message = e.what();
  } catch (...) {
    h.kind = 3;
    message = "an exception that is not a std::exception";
  }
  h.op_bytes = static_cast<std::int64_t>(op.size());
  h.message_bytes = static_cast<std::int64_t>(message.size());
  return h;
}

void check(const absl::Status& st, const Collectives& c) {
  if (!st.ok())
    throw std::runtime_error(absl::StrCat("rank ", c.rank(), " of ", c.size(), ": ", st.message()));
}

[[noreturn]] void throw_as(const FailureHeader& h, const std::string& op,
                           const std::string& message, int rank) {
  if (h.kind == 1) {
    OutOfMemoryInfo i;
    i.op = absl::StrCat(op, " on rank ", rank);
    i.requested = static_cast<std::size_t>(h.requested);
    i.budget = static_cast<std::size_t>(h.budget);
    i.reserved = static_cast<std::size_t>(h.reserved);
    i.allocated = static_cast<std::size_t>(h.allocated);
    i.pinned = static_cast<std::size_t>(h.pinned);
    i.locked = static_cast<std::size_t>(h.locked);
    throw OutOfMemoryError(i);
  }
  const std::string text = absl::StrCat("rank ", rank, ": ", message);
  if (h.kind == 2) throw ThrashError(text, static_cast<std::size_t>(h.recomputations));
  throw std::runtime_error(text);
}

}  // namespace

void agree_on_step(Collectives& collectives, std::exception_ptr failure) {
  const int ranks = collectives.size();
  absl::StatusOr<std::int64_t> worst =
      collectives.all_max(failure ? ranks - collectives.rank() : 0);
  check(worst.status(), collectives);
  if (*worst == 0) return;
  const int first = ranks - static_cast<int>(*worst);
  std::string op, message;
  FailureHeader h;
  if (collectives.rank() == first) h = describe(failure, op, message);
  check(collectives.broadcast(std::as_writable_bytes(std::span(&h, 1)), first), collectives);
  op.resize(static_cast<std::size_t>(h.op_bytes));
  message.resize(static_cast<std::size_t>(h.message_bytes));
  std::string both = op + message;
  check(collectives.broadcast(std::as_writable_bytes(std::span(both.data(), both.size())), first),
        collectives);
  if (failure) std::rethrow_exception(failure);
  throw_as(h, both.substr(0, op.size()), both.substr(op.size()), first);
}

}  // namespace remat
