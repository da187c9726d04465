#include "remat/gradient_buckets.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <utility>

#include "driver/gradient_buckets_impl.h"
#include "remat/errors.h"
#include "runtime/core/wall_clock.h"

// Note [Buckets beside the backward pass]
// A data-parallel step sums every gradient over the ranks. Summed after the backward pass,
// the exchange adds its whole time to the step; summed as the backward pass makes them
// (Note [Gradients ready early] in kernels/autograd.cc), it runs beside the kernels still to
// come. Gradients are grouped into buckets of about bucket_bytes, from the last parameter
// to the first (the order a backward pass finishes them), so that each exchange is large
// enough to be worth starting. A bucket whose gradients have all come is packed into memory
// of its own, taken from the runtime's memory resource: it counts against the budget (the
// runtime evicts to make room for it, and a step whose bucket cannot fit runs out of memory
// naming the bucket), and the gradients it holds are dropped, so the bucket replaces them.
// Its sum then runs on the exchange thread, the one thread that calls the collectives while
// the backward pass goes on; the memory is given back only after the sum is done and the
// summed gradients are made from it in finish().
//
// Ranks must make the same exchanges in the same order (remat/collectives.h), even where one
// failed in its backward pass. So buckets start strictly in order, each after the one
// before; the gradients a backward pass makes and their buckets are the same on every rank,
// so every rank starts the same prefix of buckets until one fails. finish() starts the rest
// on a rank that failed too, with zeros and its failed flag (each bucket's last element, as
// RankStep's sums carry it), and where a flag came back set every rank throws the same
// error (Note [Ranks that agree] in data_parallel.cc). On the CUDA backend with device
// collectives, the same happens on the device, ordered by streams rather than a thread (Note
// [Buckets on the device] in device_buckets.cc); without them a bucket is packed into host
// memory, outside the device's budget, and summed as on the CPU.
namespace remat {

using detail::seconds_since;

ExchangeThread::ExchangeThread() : thread_([this] { loop(); }) {}

ExchangeThread::~ExchangeThread() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void ExchangeThread::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  changed_.notify_all();
}

void ExchangeThread::wait_for(std::size_t count) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return done_ >= count; });
}

void ExchangeThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();
    lock.lock();
    ++done_;
    changed_.notify_all();
  }
}

void GradientBuckets::Impl::assign_buckets() {
  slot_of.resize(specs.size());
  std::size_t bytes = 0;
  for (std::size_t i = specs.size(); i-- > 0;) {
    if (specs[i].dtype != DType::kF32)
      throw std::invalid_argument(
          absl::StrCat("gradient buckets: gradient ", i, " is not float32"));
    if (buckets.empty() || bytes >= options.bucket_bytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    Bucket& k = buckets.back();
    slot_of[i] = {buckets.size() - 1, k.params.size()};
    k.params.push_back(i);
    k.offsets.push_back(k.floats);
    k.floats += static_cast<std::size_t>(specs[i].numel());
    bytes += static_cast<std::size_t>(specs[i].bytes());
  }
  for (Bucket& k : buckets) {
    k.pending.resize(k.params.size());
    k.came.assign(k.params.size(), false);
    stats.bytes += k.floats * sizeof(float);
    // On every backend: a rerun on the simulated one asks for what the real step does.
    if (options.device != nullptr)
      scratch_floats = std::max(scratch_floats, options.device->sum_scratch_floats(k.floats + 1));
  }
  stats.buckets = buckets.size();
}

bool GradientBuckets::Impl::in_runtime_memory() const {
  return !options.on_host && (rt.options().backend != Backend::kCuda || on_device());
}

// Packs bucket `b` and starts its sum; returns the error packing or starting it threw (a
// bucket that failed to pack goes with zeros and this rank's failed flag). Whatever threw,
// the bucket's exchange is made where the engine can still be reached: the ranks wait in it.
std::exception_ptr GradientBuckets::Impl::start(std::size_t b) {
  Bucket& k = buckets[b];
  std::exception_ptr failure;
  if (!ranks.failed()) {
    try {
      pack(k, b);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  for (Tensor& t : k.pending) t = Tensor();
  try {
    if (failure != nullptr || ranks.failed()) send_failed(k);
    if (on_device()) {
      exchange_on_device(k);
    } else if (thread != nullptr) {
      thread->submit([this, &k] { exchange(k); });
    } else if (failure == nullptr && rt.options().backend != Backend::kSimulated) {
      scale(k);  // one rank: its sum is its own
    }
  } catch (...) {
    if (failure == nullptr) failure = std::current_exception();
  }
  return failure;
}

void* GradientBuckets::Impl::take_memory(std::size_t bytes, const std::string& what) {
  try {
    return rt.memory().allocate(bytes);
  } catch (const OutOfMemoryError& e) {
    OutOfMemoryInfo info = e.info();
    info.op = absl::StrCat(what, " (", bytes, " bytes)");
    throw OutOfMemoryError(std::move(info));
  }
}

void GradientBuckets::Impl::pack(Bucket& k, std::size_t b) {
  if (!in_runtime_memory()) {
    k.host.assign(k.floats + 1, 0.0f);
  } else {
    if (scratch_floats > 0 && scratch == nullptr)
      scratch = take_memory(scratch_floats * sizeof(float), "gradient buckets' scratch");
    k.memory = take_memory(k.bytes(), absl::StrCat("gradient bucket ", b));
  }
  if (on_device()) return pack_on_device(k);
  const Backend backend = rt.options().backend;
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    const auto n = static_cast<std::size_t>(specs[k.params[s]].numel());
    if (backend == Backend::kSimulated) {
      if (k.came[s]) rt.materialize(k.pending[s]);
    } else if (k.came[s]) {
      rt.read(k.pending[s], k.data() + k.offsets[s]);
    } else {
      std::memset(k.data() + k.offsets[s], 0, n * sizeof(float));
    }
    k.pending[s] = Tensor();  // the bucket holds it now
  }
  if (backend != Backend::kSimulated) k.data()[k.floats] = 0.0f;  // not failed
}

// A rank that failed still makes the bucket's exchange: zeros, its flag set.
void GradientBuckets::Impl::send_failed(Bucket& k) {
  give_back(k);
  if (on_device()) return send_failed_on_device(k);
  k.host.assign(k.floats + 1, 0.0f);
  k.host[k.floats] = 1.0f;
}

// On the exchange thread: the sum over the ranks, then the scale.
void GradientBuckets::Impl::exchange(Bucket& k) {
  const auto t0 = std::chrono::steady_clock::now();
  k.status = ranks.collectives()->all_reduce_sum(std::span<float>(k.data(), k.floats + 1));
  if (k.status.ok() && k.data()[k.floats] == 0.0f) scale(k);
  k.exchange_seconds = seconds_since(t0);
}

// The sum's values times options.scale, on the host (the device's sum scales its own).
void GradientBuckets::Impl::scale(Bucket& k) const {
  if (options.scale == 1.0f) return;
  for (std::size_t j = 0; j < k.floats; ++j) k.data()[j] *= options.scale;
}

// Waits for bucket `b`'s sum; returns whether any rank's flag came back set. An exchange
// that failed here is kept in `ranks` as this rank's error (the step's next agreement throws
// it on every rank), so that this rank still makes the exchanges its peers wait in.
bool GradientBuckets::Impl::wait(Bucket& k, std::size_t b) {
  bool flagged = false;
  if (on_device()) {
    flagged = wait_on_device(k);
  } else if (thread != nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    thread->wait_for(b + 1);
    stats.wait_seconds += seconds_since(t0);
    stats.exchange_seconds += k.exchange_seconds;
    flagged = k.status.ok() && k.data()[k.floats] > 0.0f;
  }
  if (!k.status.ok()) {
    const int rank = on_device() ? options.device->rank() : ranks.collectives()->rank();
    const int size = on_device() ? options.device->size() : ranks.collectives()->size();
    ranks.run([&] {
      throw std::runtime_error(absl::StrCat("rank ", rank, " of ", size, ": ", k.status.message()));
    });
  }
  return flagged;
}

void GradientBuckets::Impl::unpack(Bucket& k, std::vector<Tensor>& out) {
  if (on_device()) return unpack_on_device(k, out);
  const bool runs = rt.options().backend != Backend::kSimulated;
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    if (!k.came[s]) continue;
    const TensorSpec& spec = specs[k.params[s]];
    out[k.params[s]] = rt.constant(spec, runs ? k.data() + k.offsets[s] : nullptr);
  }
}

// The bucket's memory, in the runtime's stream order on CUDA: after the unpacking copies,
// which came after the sum (Note [Buckets on the device]).
void GradientBuckets::Impl::give_back(Bucket& k) {
  if (k.memory != nullptr) rt.memory().deallocate(k.memory, k.bytes());
  k.memory = nullptr;
  k.stand_in = nullptr;
  k.host = {};
}

void GradientBuckets::Impl::give_back_scratch() {
  if (scratch != nullptr) rt.memory().deallocate(scratch, scratch_floats * sizeof(float));
  scratch = nullptr;
}

GradientBuckets::GradientBuckets(Runtime& rt, RankStep& ranks, std::vector<TensorSpec> specs,
                                 GradientBucketOptions options)
    : impl_(std::make_unique<Impl>(rt, ranks, std::move(specs), std::move(options))) {
  impl_->assign_buckets();
  if (impl_->options.device != nullptr && rt.options().backend == Backend::kCuda)
    impl_->open_device();
  else if (ranks.collectives() != nullptr)
    impl_->thread = std::make_unique<ExchangeThread>();
}

GradientBuckets::~GradientBuckets() {
  impl_->thread.reset();  // the sums in flight end before their memory goes
  if (impl_->on_device()) impl_->close_device();
  for (Impl::Bucket& k : impl_->buckets) impl_->give_back(k);
  impl_->give_back_scratch();
}

void GradientBuckets::add(std::size_t i, Tensor gradient) {
  Impl& m = *impl_;
  if (i >= m.specs.size())
    throw std::invalid_argument(
        absl::StrCat("gradient buckets: no parameter ", i, " of ", m.specs.size()));
  if (gradient.spec() != m.specs[i])
    throw std::invalid_argument(
        absl::StrCat("gradient buckets: gradient ", i, " is not of its parameter's spec"));
  const auto [b, s] = m.slot_of[i];
  Impl::Bucket& k = m.buckets[b];
  if (k.came[s])
    throw std::invalid_argument(absl::StrCat("gradient buckets: gradient ", i, " given twice"));
  k.pending[s] = std::move(gradient);
  k.came[s] = true;
  ++k.arrived;
  while (m.next < m.buckets.size() && m.buckets[m.next].arrived == m.buckets[m.next].params.size())
    if (std::exception_ptr failure = m.start(m.next++)) std::rethrow_exception(failure);
}

std::vector<Tensor> GradientBuckets::finish() {
  Impl& m = *impl_;
  while (m.next < m.buckets.size())
    if (std::exception_ptr failure = m.start(m.next++))
      m.ranks.run([&] { std::rethrow_exception(failure); });
  std::vector<Tensor> out(m.specs.size());
  bool any_failed = false;
  for (std::size_t b = 0; b < m.buckets.size(); ++b) {
    Impl::Bucket& k = m.buckets[b];
    try {
      any_failed |= m.wait(k, b);
    } catch (...) {  // the device: kept, so that this rank still waits for every bucket
      const std::exception_ptr failure = std::current_exception();
      m.ranks.run([&] { std::rethrow_exception(failure); });
    }
    if (!any_failed) m.ranks.run([&] { m.unpack(k, out); });
    m.give_back(k);
  }
  m.give_back_scratch();
  if (any_failed) m.ranks.agree();  // throws on every rank
  return out;
}

std::size_t GradientBuckets::buckets() const { return impl_->buckets.size(); }
GradientBucketStats GradientBuckets::stats() const { return impl_->stats; }

}  // namespace remat
