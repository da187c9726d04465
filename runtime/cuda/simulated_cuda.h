// A simulated CUDA device behind CudaApi: device memory, pinned memory and virtual memory that
// really exist in host RAM, streams and events on a simulated clock, kernels run as host code
// when their simulated time is up, and a race detector that says when work on two streams
// touched the same bytes without being ordered. Tests put it behind the allocator and the
// runtime to check stream-ordered memory and error handling on machines without a GPU.
//
//   remat::SimulatedCuda sim({.capacity = std::size_t{64} << 20});
//   void* x = nullptr;
//   sim.malloc(&x, 1024);
//   remat::CudaStream s = nullptr;
//   sim.stream_create(&s);
//   const remat::DeviceRange out[] = {{x, 1024}};
//   sim.launch(s, /*duration_ns=*/5000, {}, out, [x] { std::memset(x, 0, 1024); });
//   sim.stream_synchronize(s);    // simulated time passes; the body has now run
//   EXPECT_TRUE(sim.races().empty());
//
// It models one host thread: it is not thread-safe, and "the thread's" last launch error is
// the simulator's. Streams and the clock are shared by all simulated devices; only memory is
// per device.
#ifndef REMAT_RUNTIME_CUDA_SIMULATED_CUDA_H_
#define REMAT_RUNTIME_CUDA_SIMULATED_CUDA_H_

#include <absl/container/flat_hash_map.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "remat/cuda_api.h"

namespace remat {

struct SimulatedCudaOptions {
  int devices = 1;
  // Device memory per device; cudaMalloc'd and mapped bytes count against it.
  std::size_t capacity = std::size_t{1} << 30;
  // Reported as in use by mem_get_info from the start: the CUDA context and module images.
  std::size_t context_bytes = 0;
  std::size_t granularity = std::size_t{2} << 20;  // VMM; a power of two
  int major = 9;
  int minor = 0;
  double host_call_ns = 100;  // simulated host time each API call takes
  // What reserving and releasing device memory costs the host, on top of `host_call_ns`
  // (Note [What memory calls cost] in simulated_cuda.cc): cudaMalloc a fixed part plus a
  // part per GiB, up to a ceiling; cudaFree after it has waited for the device; a VMM map
  // (cuMemCreate, cuMemMap and cuMemSetAccess of one physical allocation) per call and per
  // granule; an unmap per call.
  double malloc_ns = 100e3;
  double malloc_ns_per_gib = 2e6;
  double malloc_max_ns = 10e6;
  double free_ns = 50e3;
  double map_ns = 30e3;
  double map_ns_per_granule = 5e3;
  double unmap_ns = 10e3;
  double copy_bytes_per_ns = 10;
  double copy_latency_ns = 2000;
  // The CUDA versions (1000 * major + 10 * minor): with a driver older than the runtime every
  // device query fails with cudaErrorInsufficientDriver (35), as on a real machine.
  int driver_version = 13000;
  int runtime_version = 13000;
};

// The kinds of call, for fault injection and call counts.
enum class SimulatedCall : std::uint8_t {
  kDeviceCount,
  kGetDevice,
  kSetDevice,
  kGetContext,
  kSetContext,
  kMemGetInfo,
  kComputeCapability,
  kMalloc,
  kFree,
  kMallocHost,
  kFreeHost,
  kMemcpy,
  kStreamCreate,
  kStreamDestroy,
  kStreamSynchronize,
  kStreamWaitEvent,
  kEventCreate,
  kEventDestroy,
  kEventRecord,
  kEventQuery,
  kEventSynchronize,
  kEventElapsed,
  kLastLaunchError,
  kLaunch,
  kVmmGranularity,
  kAddressReserve,
  kAddressFree,
  kMap,
  kUnmap,
};
inline constexpr std::size_t kSimulatedCallKinds =
    static_cast<std::size_t>(SimulatedCall::kUnmap) + 1;

// Bytes a simulated kernel reads or writes.
struct DeviceRange {
  const void* p = nullptr;
  std::size_t bytes = 0;
};

// Two work items on different streams touched overlapping bytes, at least one of them wrote,
// and the later one started before the earlier one had completed (Note [Race detection]).
struct Race {
  std::uint64_t first_item = 0;  // work item ids (SimulatedCuda::last_work_item)
  std::uint64_t second_item = 0;
  CudaStream first_stream = nullptr;
  CudaStream second_stream = nullptr;
  const void* p = nullptr;  // the overlap
  std::size_t bytes = 0;
  double first_start = 0, first_end = 0;
  double second_start = 0, second_end = 0;
  std::string what;
};

// A work item touched device memory that was not allocated when it was enqueued, or that was
// unmapped while it was pending. Its body does not run.
struct InvalidAccess {
  std::uint64_t item = 0;
  CudaStream stream = nullptr;
  const void* p = nullptr;
  std::size_t bytes = 0;
  bool write = false;
  double start = 0;
  std::string what;
};

class SimulatedCuda final : public CudaApi {
 public:
  explicit SimulatedCuda(SimulatedCudaOptions options = {});
  ~SimulatedCuda() override;
  SimulatedCuda(const SimulatedCuda&) = delete;
  SimulatedCuda& operator=(const SimulatedCuda&) = delete;

  // The results the simulator returns, with CUDA's codes and strings.
  static CudaResult out_of_memory();    // kOutOfMemory, 2
  static CudaResult invalid_value();    // kError, 1
  static CudaResult invalid_device();   // kError, 101
  static CudaResult invalid_handle();   // kError, 400
  static CudaResult not_ready();        // kNotReady, 600
  static CudaResult illegal_address();  // kError, 700

  const char* name() const override { return "simulated"; }

  CudaResult versions(int* driver, int* runtime) override;
  CudaResult device_count(int* count) override;
  CudaResult get_device(int* device) override;
  CudaResult set_device(int device) override;
  // Contexts: each device's primary context, created by set_device or by the first call that
  // needs a context (as the CUDA runtime does), and current per host thread (one here).
  CudaResult get_context(CudaContext* context) override;
  CudaResult set_context(CudaContext context) override;
  bool has_primary_context(int device) const;
  int current_context_device() const { return current_context_; }  // -1: none current
  CudaResult mem_get_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  CudaResult compute_capability(int device, int* major, int* minor) override;

  CudaResult malloc(void** p, std::size_t bytes) override;
  CudaResult free(void* p) override;  // synchronizes the device first
  CudaResult malloc_host(void** p, std::size_t bytes) override;
  CudaResult free_host(void* p) override;  // synchronizes the device first
  CudaResult memcpy_async(void* dst, const void* src, std::size_t bytes, CudaCopy kind,
                          CudaStream stream) override;

  CudaResult stream_create(CudaStream* stream) override;
  CudaResult stream_destroy(CudaStream stream) override;
  CudaResult stream_synchronize(CudaStream stream) override;
  CudaResult stream_wait_event(CudaStream stream, CudaEvent event) override;
  CudaResult event_create(CudaEvent* event, bool timing) override;
  CudaResult event_destroy(CudaEvent event) override;
  CudaResult event_record(CudaEvent event, CudaStream stream) override;
  CudaResult event_query(CudaEvent event) override;
  CudaResult event_synchronize(CudaEvent event) override;
  CudaResult event_elapsed_ms(float* ms, CudaEvent start, CudaEvent end) override;

  CudaResult last_launch_error() override;

  CudaResult vmm_granularity(int device, std::size_t* granularity) override;
  CudaResult address_reserve(void** p, std::size_t bytes) override;
  CudaResult address_free(void* p, std::size_t bytes) override;
  CudaResult map(void* p, std::size_t bytes, int device) override;
  CudaResult unmap(void* p, std::size_t bytes) override;

  // A kernel launch: work on `stream` that takes `duration_ns`, reads and writes the given
  // device ranges, and runs `body` (host code standing in for the kernel) when it completes.
  // The body should capture pointer values and must not call the simulator. Sets the last
  // launch error where the launch fails (as cudaLaunchKernel does).
  CudaResult launch(CudaStream stream, double duration_ns, std::span<const DeviceRange> reads,
                    std::span<const DeviceRange> writes, std::function<void()> body = {});

  // Fault injection: the (skip+1)-th next call of that kind returns `result` and does
  // nothing else (host time still passes). An injected launch result is also the last
  // launch error.
  void inject(SimulatedCall call, CudaResult result, int skip = 0);
  // The next launch faults (Note [Sticky faults]).
  void inject_sticky_fault();
  // Calls of that kind so far, including failed ones.
  std::size_t calls(SimulatedCall call) const;

  const std::vector<Race>& races() const { return races_; }
  const std::vector<InvalidAccess>& invalid_accesses() const { return invalid_accesses_; }
  void clear_races() { races_.clear(); }
  void clear_invalid_accesses() { invalid_accesses_.clear(); }

  // Simulated host time in ns; `advance` lets host time pass, completing work due by then.
  double now() const { return now_; }
  void advance(double ns);
  // Waits for all pending work (cudaDeviceSynchronize); takes no host time of its own.
  void synchronize_all();
  // Runs now, in order, the bodies of the pending work that new work on `stream` would start
  // after, as far as the last one that touches `touched` (all of it where `touched` is
  // empty) (Note [Host code run as a kernel]); takes no time, and the work stays pending for
  // race detection.
  void catch_up(CudaStream stream, std::span<const DeviceRange> touched = {});
  // The times the host waited for the device: a synchronization, a free or a copy from or to
  // pageable memory that found the work it waits for not yet done.
  std::size_t host_waits() const { return host_waits_; }

  std::size_t device_bytes_in_use(int device = 0) const;  // malloc'd plus mapped
  std::size_t live_allocations() const { return device_allocations_.size(); }  // malloc
  std::size_t live_host_allocations() const { return host_allocations_.size(); }
  std::size_t live_reservations() const { return reservations_.size(); }
  std::size_t pending_work() const { return pending_.size(); }
  bool is_pinned(const void* p) const;
  // The id of the work item the last launch or copy enqueued (0 before any), as in Race.
  std::uint64_t last_work_item() const { return last_item_; }
  const SimulatedCudaOptions& options() const { return options_; }

 private:
  struct Access {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    bool write = false;
  };
  struct WorkItem {
    std::uint64_t id = 0;
    CudaStream stream = nullptr;
    double start = 0;
    double end = 0;
    std::vector<Access> accesses;
    std::function<void()> body;  // empty once run (or caught up)
    const char* what = "";
    bool skip_body = false;
  };
  struct StreamState {
    double tail = 0;  // when the work enqueued so far completes
    int number = 0;   // for messages; 0 is the legacy stream
  };
  struct EventState {
    bool timing = false;
    bool recorded = false;
    double time = 0;
  };
  struct DeviceAllocation {
    std::size_t bytes = 0;
    int device = 0;
  };
  struct HostAllocation {
    std::size_t bytes = 0;
  };
  struct Reservation {
    std::size_t bytes = 0;
    void* mapping = nullptr;  // what mmap returned, and its length
    std::size_t mapping_bytes = 0;
    std::vector<int> granule_device;  // -1 where the granule is not mapped
  };
  struct Injection {
    int skip = 0;
    CudaResult result;
  };

  std::optional<CudaResult> begin(SimulatedCall call);
  std::optional<CudaResult> take_injection(SimulatedCall call);
  void advance_to(double t);
  void wait_until(double t);  // advance_to, counted in host_waits_ where the clock moves
  void drain();
  double ready_time(CudaStream stream) const;
  bool valid_device(int device) const { return device >= 0 && device < options_.devices; }
  bool fits(int device, std::size_t bytes) const;
  double malloc_price(std::size_t bytes) const;  // Note [What memory calls cost]
  void make_current(int device);                 // creating its primary context
  CudaResult fail_launch(CudaResult result);
  void fault();

  // Enqueues a work item and returns its end time (Note [Deferred execution]).
  double enqueue(CudaStream stream, double duration_ns, std::vector<Access> accesses,
                 std::function<void()> body, const char* what);
  const char* inaccessible(const Access& a) const;
  void check_races(const WorkItem& item);
  std::string describe(const WorkItem& item) const;
  std::string stream_name(CudaStream stream) const;

  const Reservation* find_reservation(std::uintptr_t a, std::uintptr_t* base) const;
  Reservation* granules(void* p, std::size_t bytes, std::size_t* first, std::size_t* count);

  SimulatedCudaOptions options_;
  double now_ = 0;
  std::size_t host_waits_ = 0;
  int current_device_ = 0;
  int current_context_ = -1;            // the device whose primary context is current
  std::vector<char> primary_contexts_;  // per device: created; its address is the handle
  std::vector<std::size_t> used_;       // per device

  std::map<std::uintptr_t, DeviceAllocation> device_allocations_;
  std::map<std::uintptr_t, HostAllocation> host_allocations_;  // pinned
  std::map<std::uintptr_t, Reservation> reservations_;

  std::uintptr_t next_handle_ = 0;
  int next_stream_number_ = 1;
  absl::flat_hash_map<CudaStream, StreamState> streams_;  // with the legacy stream, nullptr
  absl::flat_hash_map<CudaEvent, EventState> events_;
  double retired_tail_ = 0;  // the latest tail of a destroyed stream

  std::map<std::pair<double, std::uint64_t>, WorkItem> pending_;  // by (end, id)
  std::uint64_t last_item_ = 0;
  std::vector<Race> races_;
  std::vector<InvalidAccess> invalid_accesses_;

  std::array<std::size_t, kSimulatedCallKinds> calls_{};
  std::array<std::vector<Injection>, kSimulatedCallKinds> injections_;
  CudaResult last_launch_error_;
  bool sticky_pending_ = false;
  bool sticky_ = false;
};

}  // namespace remat

#endif  // REMAT_RUNTIME_CUDA_SIMULATED_CUDA_H_
