#include "remat/data_parallel.h"

#include <absl/strings/str_cat.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/errors.h"

// Note [Ranks that agree]
// A collective waits for every rank. A rank whose step failed before reaching one (out of
// memory in its backward pass, say) must not leave the others waiting, and must not go on
// to a different collective (its step driver's) while they wait in this one. So a step's
// local work runs through RankStep::run, which keeps an error instead of throwing it, and
// every exchange carries a flag of whether its rank has failed: a sum one more element, a
// gather one more per rank. Every rank enters every exchange of the step whatever happened
// to it; where a flag came back set, every rank calls agree_on_step, which sends the first
// failing rank's error to all, and every rank throws it, as its type. The ranks' step
// drivers then take the same path: they agree whether a step that ran out of memory is
// run again under a plan (StepDriverOptions::collectives).
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

RankStep::RankStep(Runtime& rt, Collectives* collectives)
    : rt_(rt),
      collectives_(collectives != nullptr && collectives->size() > 1 &&
                           rt.options().backend != Backend::kSimulated
                       ? collectives
                       : nullptr) {}

void RankStep::run(const std::function<void()>& work) {
  if (collectives_ == nullptr) {
    work();
    return;
  }
  if (failure_) return;
  try {
    work();
  } catch (...) {
    failure_ = std::current_exception();
  }
}

void RankStep::agree_if(bool any_failed) {
  if (any_failed) agree_on_step(*collectives_, failure_);
}

Tensor RankStep::all_reduce_sum(const Tensor& t) {
  const TensorSpec spec = t.spec();
  if (spec.dtype != DType::kF32)
    throw std::invalid_argument("all_reduce_sum: only float32 tensors are summed across ranks");
  if (rt_.options().backend == Backend::kSimulated) return rt_.constant(spec, nullptr);
  const auto n = static_cast<std::size_t>(spec.numel());
  std::vector<float> host(collectives_ != nullptr ? n + 1 : n, 0.0f);
  run([&] { rt_.read(t, host.data()); });
  if (collectives_ == nullptr) return rt_.constant(spec, host.data());
  host[n] = failure_ ? 1.0f : 0.0f;
  check(collectives_->all_reduce_sum(host), *collectives_);
  agree_if(host[n] > 0);
  Tensor out;
  run([&] { out = rt_.constant(spec, host.data()); });
  return out;
}

std::vector<float> RankStep::all_gather(std::span<const float> mine) {
  if (rt_.options().backend == Backend::kSimulated) return {};
  if (collectives_ == nullptr) return {mine.begin(), mine.end()};
  const std::size_t n = mine.size() + 1;
  std::vector<float> own(mine.begin(), mine.end());
  own.push_back(failure_ ? 1.0f : 0.0f);
  std::vector<float> all(n * static_cast<std::size_t>(collectives_->size()));
  check(collectives_->all_gather(own, all), *collectives_);
  bool any = false;
  std::vector<float> out;
  for (int r = 0; r < collectives_->size(); ++r) {
    const auto at = static_cast<std::size_t>(r) * n;
    any |= all[at + n - 1] > 0;
    out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(at),
               all.begin() + static_cast<std::ptrdiff_t>(at + n - 1));
  }
  agree_if(any);
  return out;
}

void RankStep::agree() {
  if (collectives_ != nullptr) agree_on_step(*collectives_, failure_);
}

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
  if (collectives.rank() == first) std::rethrow_exception(failure);
  throw_as(h, both.substr(0, op.size()), both.substr(op.size()), first);
}

}  // namespace remat
