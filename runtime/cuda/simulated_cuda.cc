#include "runtime/cuda/simulated_cuda.h"

#include <absl/strings/str_cat.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "runtime/cuda/simulated_cuda_internal.h"

namespace remat {

// Note [Simulated time]
// The host has a clock, `now_`, that every API call advances by `host_call_ns`. Each stream
// has a tail: when the work enqueued on it so far completes. A work item (a launch or a copy)
// starts at the later of `now_` and the stream's ready time and ends `duration` later.
// stream_wait_event raises the stream's tail to the event's time, so later work on it starts
// after the work the event follows; an event's time is the ready time of its stream when it
// is recorded (or `now_`, where the stream is idle).
//
// The legacy default stream (null) synchronizes with the blocking streams that stream_create
// makes: an operation on it waits for all work enqueued on every stream so far, and work on
// a created stream waits for the legacy stream's tail. So the legacy stream's ready time is
// the latest tail of all streams, and any operation on it (work, an event record, a wait)
// raises its tail to that: it is a barrier, as in CUDA.

// Note [Deferred execution]
// Work runs in simulated time: a work item's body runs when the host clock passes its end
// time, which happens at the start of every API call (after the call's host time), in
// `advance`, and when a call waits (synchronize, cudaFree), in order of end time. A stream's
// items end in the order they were enqueued, so ordering by (end, id) keeps stream order.
// Copies are bodies too: a copy from pinned host memory reads the source when it completes,
// so a caller that overwrites the source too early uploads the new bytes, and one that reads
// a pinned destination too early reads stale bytes, as on a GPU. A copy from or to pageable
// memory is synchronous with respect to the host, as in CUDA: the host waits until it has
// completed. A sticky fault drops all pending work: the context is lost.

// Note [Race detection]
// Every pending work item keeps its stream, times and the ranges it reads and writes. When an
// item is enqueued on stream S to start at t, every pending item on another stream that
// overlaps it, where either writes, and that ends after t is a race: nothing ordered the two,
// and the first one had not completed when the second started. Items on the same stream are
// ordered by the stream and never race. An item is pending until the clock passes its end,
// and an item that ended at or before `now_` cannot race with anything enqueued now (t >=
// now_), so the pending items are exactly the records that need keeping. One Race is reported
// per pair of items, for the first overlap found.
//
// A range is accessible if it lies within one live cudaMalloc allocation, one pinned host
// allocation (device-accessible through unified addressing), or mapped granules of one
// reservation. An item that touches anything else is an invalid access, and so is a pending
// item whose granules are unmapped under it (unmap does not synchronize). Such an item's body
// does not run: its memory may be gone.

// Note [Sticky faults]
// inject_sticky_fault makes the next launch fault: the launch itself is accepted (kernel
// faults are asynchronous), its last launch error is illegal_address, and from then on every
// API call returns illegal_address and does nothing, as a CUDA context is unusable after an
// illegal memory access. Pending work is dropped.

using namespace detail::simulated_cuda;  // NOLINT: this file's own helpers

SimulatedCuda::SimulatedCuda(SimulatedCudaOptions options)
    : options_(options),
      primary_contexts_(std::max(options.devices, 0), 0),
      used_(std::max(options.devices, 0)) {
  if (options_.devices < 1) throw std::invalid_argument("SimulatedCuda: devices < 1");
  const std::size_t g = options_.granularity;
  if (g == 0 || (g & (g - 1)) != 0) {
    throw std::invalid_argument("SimulatedCuda: granularity must be a power of two");
  }
  streams_[nullptr] = StreamState{};
}

SimulatedCuda::~SimulatedCuda() {
  pending_.clear();  // bodies may refer to the memory freed below; they never run
  for (const auto& [base, a] : device_allocations_) std::free(reinterpret_cast<void*>(base));
  for (const auto& [base, a] : host_allocations_) std::free(reinterpret_cast<void*>(base));
  for (const auto& [base, r] : reservations_) munmap(r.mapping, r.mapping_bytes);
}

CudaResult SimulatedCuda::out_of_memory() { return {CudaStatus::kOutOfMemory, 2, "out of memory"}; }
CudaResult SimulatedCuda::invalid_value() { return {CudaStatus::kError, 1, "invalid argument"}; }
CudaResult SimulatedCuda::invalid_device() {
  return {CudaStatus::kError, 101, "invalid device ordinal"};
}
CudaResult SimulatedCuda::invalid_handle() {
  return {CudaStatus::kError, 400, "invalid resource handle"};
}
CudaResult SimulatedCuda::not_ready() { return {CudaStatus::kNotReady, 600, "device not ready"}; }
CudaResult SimulatedCuda::illegal_address() {
  return {CudaStatus::kError, 700, "an illegal memory access was encountered"};
}

// --- Calls, time and injection --------------------------------------------------------------

// What every API call does first: counts itself, fails on a lost context, takes host time
// (completing the work due by then), and takes an injected result. Empty: go on.
std::optional<CudaResult> SimulatedCuda::begin(SimulatedCall call) {
  ++calls_[index(call)];
  if (sticky_) return illegal_address();
  advance_to(now_ + options_.host_call_ns);
  const bool needs_context =
      call != SimulatedCall::kDeviceCount && call != SimulatedCall::kGetDevice &&
      call != SimulatedCall::kSetDevice && call != SimulatedCall::kGetContext &&
      call != SimulatedCall::kSetContext;
  if (needs_context && current_context_ < 0) make_current(current_device_);
  return take_injection(call);
}

std::optional<CudaResult> SimulatedCuda::take_injection(SimulatedCall call) {
  std::vector<Injection>& pending = injections_[index(call)];
  std::optional<CudaResult> result;
  for (auto it = pending.begin(); it != pending.end();) {
    if (it->skip == 0 && !result) {
      result = it->result;
      it = pending.erase(it);
      continue;
    }
    if (it->skip > 0) --it->skip;  // two due at once: the later one fires at the next call
    ++it;
  }
  return result;
}

void SimulatedCuda::inject(SimulatedCall call, CudaResult result, int skip) {
  injections_[index(call)].push_back({std::max(skip, 0), result});
}

void SimulatedCuda::inject_sticky_fault() { sticky_pending_ = true; }

std::size_t SimulatedCuda::calls(SimulatedCall call) const { return calls_[index(call)]; }

void SimulatedCuda::advance(double ns) { advance_to(now_ + std::max(ns, 0.0)); }

void SimulatedCuda::advance_to(double t) {
  now_ = std::max(now_, t);
  drain();
}

void SimulatedCuda::synchronize_all() {
  if (!pending_.empty()) wait_until(pending_.rbegin()->second.end);
}

void SimulatedCuda::wait_until(double t) {
  if (t > now_) ++host_waits_;
  advance_to(t);
}

// Note [Host code run as a kernel]
// A framework's host kernel (a PyTorch CPU kernel standing in for its CUDA one) cannot be a
// deferred body: it takes scratch memory while it runs, through the allocator and so through
// this simulator, which a body must not call. It runs on the host when it is launched
// instead, and its launch is recorded with an empty body. For it to see what a GPU would,
// every piece of work that new work on its stream would start after has to have run first:
// catch_up runs those bodies now, in order of end time. They end by the stream's ready time,
// so in simulated time they are complete when the kernel starts, and running them early is
// exact. They stay pending, so work enqueued later on other streams is still checked against
// them (Note [Race detection]), and work not ordered before the kernel (other streams' later
// items) still runs at its own end, after it. Only as far as the last of that work which
// touches the kernel's memory: a copy to pinned host memory the kernel does not read still
// completes when its time comes, so host code that reads it too early still reads stale
// bytes, as on a GPU (the work before the last one runs too, keeping the order of writes).
void SimulatedCuda::catch_up(CudaStream stream, std::span<const DeviceRange> touched) {
  if (sticky_ || !streams_.contains(stream)) return;
  const double t = std::max(now_, ready_time(stream));
  auto touches = [&](const WorkItem& item) {
    if (touched.empty()) return true;
    for (const Access& a : item.accesses)
      for (const DeviceRange& r : touched) {
        const auto begin = reinterpret_cast<std::uintptr_t>(r.p);
        if (overlap(a.begin, a.end, begin, begin + r.bytes)) return true;
      }
    return false;
  };
  // The prefix to run: as far as the last due item that touches the kernel's memory.
  auto stop = pending_.begin();
  for (auto it = pending_.begin(); it != pending_.end() && it->second.end <= t; ++it)
    if (touches(it->second)) stop = std::next(it);
  for (auto it = pending_.begin(); it != stop; ++it)
    if (it->second.body && !it->second.skip_body) std::exchange(it->second.body, nullptr)();
}

// Runs the bodies of the work items the clock has passed, in order of end time.
void SimulatedCuda::drain() {
  while (!pending_.empty() && pending_.begin()->second.end <= now_) {
    auto node = pending_.extract(pending_.begin());
    const WorkItem& item = node.mapped();
    if (item.body && !item.skip_body) item.body();
  }
}

double SimulatedCuda::ready_time(CudaStream stream) const {
  if (stream == nullptr) {
    double t = retired_tail_;
    for (const auto& [s, state] : streams_) t = std::max(t, state.tail);
    return t;
  }
  return std::max(streams_.at(stream).tail, streams_.at(nullptr).tail);
}

// --- Devices --------------------------------------------------------------------------------

CudaResult SimulatedCuda::versions(int* driver, int* runtime) {
  *driver = options_.driver_version;
  *runtime = options_.runtime_version;
  return {};
}

CudaResult SimulatedCuda::device_count(int* count) {
  if (auto r = begin(SimulatedCall::kDeviceCount)) return *r;
  if (count == nullptr) return invalid_value();
  if (options_.driver_version < options_.runtime_version) {
    *count = 0;
    return {CudaStatus::kError, 35, "CUDA driver version is insufficient for CUDA runtime version"};
  }
  *count = options_.devices;
  return {};
}

CudaResult SimulatedCuda::get_device(int* device) {
  if (auto r = begin(SimulatedCall::kGetDevice)) return *r;
  if (device == nullptr) return invalid_value();
  *device = current_device_;
  return {};
}

CudaResult SimulatedCuda::set_device(int device) {
  if (auto r = begin(SimulatedCall::kSetDevice)) return *r;
  if (!valid_device(device)) return invalid_device();
  make_current(device);
  return {};
}

void SimulatedCuda::make_current(int device) {
  primary_contexts_[device] = 1;
  current_context_ = device;
  current_device_ = device;
}

bool SimulatedCuda::has_primary_context(int device) const {
  return valid_device(device) && primary_contexts_[device] != 0;
}

CudaResult SimulatedCuda::get_context(CudaContext* context) {
  if (auto r = begin(SimulatedCall::kGetContext)) return *r;
  if (context == nullptr) return invalid_value();
  *context = current_context_ < 0
                 ? nullptr
                 : reinterpret_cast<CudaContext>(&primary_contexts_[current_context_]);
  return {};
}

CudaResult SimulatedCuda::set_context(CudaContext context) {
  if (auto r = begin(SimulatedCall::kSetContext)) return *r;
  if (context == nullptr) {
    current_context_ = -1;
    return {};
  }
  const char* handle = reinterpret_cast<const char*>(context);
  if (handle < primary_contexts_.data() ||
      handle >= primary_contexts_.data() + primary_contexts_.size())
    return invalid_handle();
  make_current(static_cast<int>(handle - primary_contexts_.data()));
  return {};
}

CudaResult SimulatedCuda::mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  if (auto r = begin(SimulatedCall::kMemGetInfo)) return *r;
  if (free_bytes == nullptr || total_bytes == nullptr) return invalid_value();
  const std::size_t taken = used_[current_device_] + options_.context_bytes;
  *free_bytes = taken >= options_.capacity ? 0 : options_.capacity - taken;
  *total_bytes = options_.capacity;
  return {};
}

CudaResult SimulatedCuda::compute_capability(int device, int* major, int* minor) {
  if (auto r = begin(SimulatedCall::kComputeCapability)) return *r;
  if (major == nullptr || minor == nullptr) return invalid_value();
  if (!valid_device(device)) return invalid_device();
  *major = options_.major;
  *minor = options_.minor;
  return {};
}

bool SimulatedCuda::fits(int device, std::size_t bytes) const {
  const std::size_t taken = used_[device] + options_.context_bytes;
  return taken <= options_.capacity && bytes <= options_.capacity - taken;
}

std::size_t SimulatedCuda::device_bytes_in_use(int device) const {
  return valid_device(device) ? used_[device] : 0;
}

// --- Memory ---------------------------------------------------------------------------------

// Note [What memory calls cost]
// On a GPU the calls that reserve and release device memory are dear, and a simulator that
// charged them like any other call would favour what a GPU punishes: giving segments back and
// reserving them again at every step. cudaMalloc takes from about 0.1 ms to 10 ms, more for
// larger sizes (the driver finds and maps physical pages); cudaFree first waits for the whole
// device, then takes tens of microseconds; growing a virtual range maps physical memory with
// cuMemCreate, cuMemMap and cuMemSetAccess, tens of microseconds per call and more per granule
// (PyTorch maps 20 MiB handles and sets access once per range for this reason). The options'
// defaults follow these figures: malloc 0.1 ms + 2 ms per GiB up to 10 ms, free 50 us after
// the wait, map 30 us + 5 us per granule, unmap 10 us. A call that fails on its arguments
// costs only the host call; one refused for want of memory costs the attempt.
double SimulatedCuda::malloc_price(std::size_t bytes) const {
  const double gib = static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30);
  return std::min(options_.malloc_ns + gib * options_.malloc_ns_per_gib, options_.malloc_max_ns);
}

CudaResult SimulatedCuda::malloc(void** p, std::size_t bytes) {
  if (auto r = begin(SimulatedCall::kMalloc)) return *r;
  if (p == nullptr) return invalid_value();
  *p = nullptr;
  if (bytes == 0) return {};  // as cudaMalloc: success, and a null pointer
  advance(malloc_price(bytes));
  if (!fits(current_device_, bytes)) return out_of_memory();
  void* q = std::aligned_alloc(kMallocAlignment, round_up(bytes, kMallocAlignment));
  if (q == nullptr) return out_of_memory();
  device_allocations_[address(q)] = {bytes, current_device_};
  used_[current_device_] += bytes;
  *p = q;
  return {};
}

CudaResult SimulatedCuda::free(void* p) {
  if (auto r = begin(SimulatedCall::kFree)) return *r;
  if (p == nullptr) return {};
  auto it = device_allocations_.find(address(p));
  if (it == device_allocations_.end()) return invalid_value();
  synchronize_all();  // cudaFree waits for the device
  advance(options_.free_ns);
  used_[it->second.device] -= it->second.bytes;
  device_allocations_.erase(it);
  std::free(p);
  return {};
}

CudaResult SimulatedCuda::malloc_host(void** p, std::size_t bytes) {
  if (auto r = begin(SimulatedCall::kMallocHost)) return *r;
  if (p == nullptr) return invalid_value();
  *p = nullptr;
  if (bytes == 0) return {};
  void* q = std::aligned_alloc(kMallocAlignment, round_up(bytes, kMallocAlignment));
  if (q == nullptr) return out_of_memory();
  host_allocations_[address(q)] = {bytes};
  *p = q;
  return {};
}

CudaResult SimulatedCuda::free_host(void* p) {
  if (auto r = begin(SimulatedCall::kFreeHost)) return *r;
  if (p == nullptr) return {};
  auto it = host_allocations_.find(address(p));
  if (it == host_allocations_.end()) return invalid_value();
  synchronize_all();  // cudaFreeHost waits for the device
  host_allocations_.erase(it);
  std::free(p);
  return {};
}

bool SimulatedCuda::is_pinned(const void* p) const {
  return containing(host_allocations_, address(p)) != host_allocations_.end();
}

CudaResult SimulatedCuda::memcpy_async(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                                       CudaStream stream) {
  if (auto r = begin(SimulatedCall::kMemcpy)) return *r;
  if (!streams_.contains(stream)) return invalid_handle();
  if (bytes == 0) return {};
  if (dst == nullptr || src == nullptr) return invalid_value();
  const Access read{address(src), address(src) + bytes, false};
  const Access write{address(dst), address(dst) + bytes, true};
  // Whether the host side is pinned (Note [Deferred execution]); host ranges are tracked only
  // there, since the device touches pageable memory only while the host waits.
  auto pinned = [this](const Access& a) {
    auto it = containing(host_allocations_, a.begin);
    return it != host_allocations_.end() && a.end <= it->first + it->second.bytes;
  };
  std::vector<Access> accesses;
  bool deferred = true;
  const char* what = "memcpy device to device";
  switch (kind) {
    case CudaCopy::kHostToDevice:
      what = "memcpy host to device";
      deferred = pinned(read);
      accesses.push_back(write);
      if (deferred) accesses.push_back(read);
      break;
    case CudaCopy::kDeviceToHost:
      what = "memcpy device to host";
      deferred = pinned(write);
      accesses.push_back(read);
      if (deferred) accesses.push_back(write);
      break;
    case CudaCopy::kDeviceToDevice:
      accesses = {read, write};
      break;
  }
  const double duration = options_.copy_latency_ns + bytes / options_.copy_bytes_per_ns;
  const double end = enqueue(
      stream, duration, std::move(accesses), [dst, src, bytes] { std::memmove(dst, src, bytes); },
      what);
  if (!deferred) wait_until(end);
  return {};
}

// --- Streams and events ---------------------------------------------------------------------

CudaResult SimulatedCuda::stream_create(CudaStream* stream) {
  if (auto r = begin(SimulatedCall::kStreamCreate)) return *r;
  if (stream == nullptr) return invalid_value();
  *stream = reinterpret_cast<CudaStream>(kHandleBase + 16 * next_handle_++);
  streams_[*stream] = {.tail = 0, .number = next_stream_number_++};
  return {};
}

CudaResult SimulatedCuda::stream_destroy(CudaStream stream) {
  if (auto r = begin(SimulatedCall::kStreamDestroy)) return *r;
  auto it = streams_.find(stream);
  if (stream == nullptr || it == streams_.end()) return invalid_handle();
  // Its pending work still runs; the legacy stream still waits for it.
  retired_tail_ = std::max(retired_tail_, it->second.tail);
  streams_.erase(it);
  return {};
}

CudaResult SimulatedCuda::stream_synchronize(CudaStream stream) {
  if (auto r = begin(SimulatedCall::kStreamSynchronize)) return *r;
  if (!streams_.contains(stream)) return invalid_handle();
  wait_until(stream == nullptr ? ready_time(nullptr) : streams_.at(stream).tail);
  return {};
}

CudaResult SimulatedCuda::stream_wait_event(CudaStream stream, CudaEvent event) {
  if (auto r = begin(SimulatedCall::kStreamWaitEvent)) return *r;
  auto s = streams_.find(stream);
  auto e = events_.find(event);
  if (s == streams_.end() || e == events_.end()) return invalid_handle();
  if (stream == nullptr) s->second.tail = ready_time(nullptr);  // a barrier
  // An event never recorded has nothing to wait for, as in CUDA.
  if (e->second.recorded) s->second.tail = std::max(s->second.tail, e->second.time);
  return {};
}

CudaResult SimulatedCuda::event_create(CudaEvent* event, bool timing) {
  if (auto r = begin(SimulatedCall::kEventCreate)) return *r;
  if (event == nullptr) return invalid_value();
  *event = reinterpret_cast<CudaEvent>(kHandleBase + 16 * next_handle_++);
  events_[*event] = {.timing = timing};
  return {};
}

CudaResult SimulatedCuda::event_destroy(CudaEvent event) {
  if (auto r = begin(SimulatedCall::kEventDestroy)) return *r;
  if (events_.erase(event) == 0) return invalid_handle();
  return {};
}

CudaResult SimulatedCuda::event_record(CudaEvent event, CudaStream stream) {
  if (auto r = begin(SimulatedCall::kEventRecord)) return *r;
  auto s = streams_.find(stream);
  auto e = events_.find(event);
  if (s == streams_.end() || e == events_.end()) return invalid_handle();
  const double ready = ready_time(stream);
  if (stream == nullptr) s->second.tail = ready;  // a barrier
  e->second.recorded = true;
  e->second.time = std::max(now_, ready);
  return {};
}

CudaResult SimulatedCuda::event_query(CudaEvent event) {
  if (auto r = begin(SimulatedCall::kEventQuery)) return *r;
  auto e = events_.find(event);
  if (e == events_.end()) return invalid_handle();
  if (e->second.recorded && now_ < e->second.time) return not_ready();
  return {};
}

CudaResult SimulatedCuda::event_synchronize(CudaEvent event) {
  if (auto r = begin(SimulatedCall::kEventSynchronize)) return *r;
  auto e = events_.find(event);
  if (e == events_.end()) return invalid_handle();
  if (e->second.recorded) wait_until(e->second.time);
  return {};
}

CudaResult SimulatedCuda::event_elapsed_ms(float* ms, CudaEvent start, CudaEvent end) {
  if (auto r = begin(SimulatedCall::kEventElapsed)) return *r;
  if (ms == nullptr) return invalid_value();
  auto a = events_.find(start);
  auto b = events_.find(end);
  if (a == events_.end() || b == events_.end()) return invalid_handle();
  // CUDA's answers: an event without timing or never recorded is an invalid handle, one
  // still pending is not ready.
  for (const EventState* e : {&a->second, &b->second}) {
    if (!e->timing || !e->recorded) return invalid_handle();
  }
  if (now_ < a->second.time || now_ < b->second.time) return not_ready();
  *ms = static_cast<float>((b->second.time - a->second.time) / 1e6);
  return {};
}

// --- Launches and work ----------------------------------------------------------------------

CudaResult SimulatedCuda::last_launch_error() {
  if (auto r = begin(SimulatedCall::kLastLaunchError)) return *r;
  return std::exchange(last_launch_error_, CudaResult{});
}

CudaResult SimulatedCuda::fail_launch(CudaResult result) {
  last_launch_error_ = result;
  return result;
}

void SimulatedCuda::fault() {
  sticky_pending_ = false;
  sticky_ = true;
  last_launch_error_ = illegal_address();
  pending_.clear();
}

CudaResult SimulatedCuda::launch(CudaStream stream, double duration_ns,
                                 std::span<const DeviceRange> reads,
                                 std::span<const DeviceRange> writes, std::function<void()> body) {
  if (auto r = begin(SimulatedCall::kLaunch)) return fail_launch(*r);
  if (sticky_pending_) {
    fault();
    return {};  // accepted: the kernel faults as it runs (Note [Sticky faults])
  }
  if (!streams_.contains(stream)) return fail_launch(invalid_handle());
  if (!(duration_ns >= 0) || std::isinf(duration_ns)) return fail_launch(invalid_value());
  std::vector<Access> accesses;
  accesses.reserve(reads.size() + writes.size());
  for (const DeviceRange& r : reads) {
    if (r.bytes > 0) accesses.push_back({address(r.p), address(r.p) + r.bytes, false});
  }
  for (const DeviceRange& w : writes) {
    if (w.bytes > 0) accesses.push_back({address(w.p), address(w.p) + w.bytes, true});
  }
  enqueue(stream, duration_ns, std::move(accesses), std::move(body), "launch");
  return {};
}

double SimulatedCuda::enqueue(CudaStream stream, double duration_ns, std::vector<Access> accesses,
                              std::function<void()> body, const char* what) {
  WorkItem item{.id = ++last_item_,
                .stream = stream,
                .start = std::max(now_, ready_time(stream)),
                .accesses = std::move(accesses),
                .body = std::move(body),
                .what = what};
  item.end = item.start + duration_ns;
  for (const Access& a : item.accesses) {
    const char* why = inaccessible(a);
    if (why == nullptr) continue;
    item.skip_body = true;
    invalid_accesses_.push_back(
        {.item = item.id,
         .stream = stream,
         .p = pointer(a.begin),
         .bytes = a.end - a.begin,
         .write = a.write,
         .start = item.start,
         .what = absl::StrCat(describe(item), a.write ? " writes " : " reads ", a.end - a.begin,
                              " bytes at 0x", absl::Hex(a.begin), ": ", why)});
  }
  check_races(item);
  streams_.at(stream).tail = item.end;  // >= every tail for the legacy stream: a barrier
  const double end = item.end;
  pending_.emplace(std::make_pair(end, item.id), std::move(item));
  return end;
}

// Why `a` is not device-accessible memory, or null where it is (Note [Race detection]).
const char* SimulatedCuda::inaccessible(const Access& a) const {
  if (auto it = containing(device_allocations_, a.begin); it != device_allocations_.end()) {
    return a.end <= it->first + it->second.bytes ? nullptr : "past the end of an allocation";
  }
  if (auto it = containing(host_allocations_, a.begin); it != host_allocations_.end()) {
    return a.end <= it->first + it->second.bytes ? nullptr : "past the end of pinned memory";
  }
  std::uintptr_t base = 0;
  const Reservation* r = find_reservation(a.begin, &base);
  if (r == nullptr) return "not allocated (freed or never allocated)";
  if (a.end > base + r->bytes) return "past the end of a reservation";
  const std::size_t g = options_.granularity;
  for (std::size_t i = (a.begin - base) / g; i <= (a.end - 1 - base) / g; ++i) {
    if (r->granule_device[i] < 0) return "an unmapped granule";
  }
  return nullptr;
}

void SimulatedCuda::check_races(const WorkItem& item) {
  for (const auto& [key, earlier] : pending_) {
    if (earlier.stream == item.stream || earlier.end <= item.start) continue;
    for (const Access& a : earlier.accesses) {
      auto conflict = [&a](const Access& b) {
        return (a.write || b.write) && overlap(a.begin, a.end, b.begin, b.end);
      };
      auto b = std::find_if(item.accesses.begin(), item.accesses.end(), conflict);
      if (b == item.accesses.end()) continue;
      const std::uintptr_t lo = std::max(a.begin, b->begin);
      const std::uintptr_t hi = std::min(a.end, b->end);
      races_.push_back(
          {.first_item = earlier.id,
           .second_item = item.id,
           .first_stream = earlier.stream,
           .second_stream = item.stream,
           .p = pointer(lo),
           .bytes = hi - lo,
           .first_start = earlier.start,
           .first_end = earlier.end,
           .second_start = item.start,
           .second_end = item.end,
           .what = absl::StrCat(describe(item), b->write ? " writes " : " reads ", hi - lo,
                                " bytes at 0x", absl::Hex(lo), " that ", describe(earlier),
                                a.write ? " writes" : " reads", " and has not completed")});
      break;  // one race per pair of items
    }
  }
}

std::string SimulatedCuda::describe(const WorkItem& item) const {
  return absl::StrCat(item.what, " #", item.id, " on ", stream_name(item.stream), " [", item.start,
                      ", ", item.end, ") ns");
}

std::string SimulatedCuda::stream_name(CudaStream stream) const {
  if (stream == nullptr) return "the legacy stream";
  auto it = streams_.find(stream);
  if (it == streams_.end()) return "a destroyed stream";
  return absl::StrCat("stream ", it->second.number);
}

}  // namespace remat
