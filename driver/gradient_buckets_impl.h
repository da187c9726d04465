// GradientBuckets' state (remat/gradient_buckets.h), shared by its host path
// (gradient_buckets.cc) and its device path (device_buckets.cc).
#ifndef REMAT_DRIVER_GRADIENT_BUCKETS_IMPL_H_
#define REMAT_DRIVER_GRADIENT_BUCKETS_IMPL_H_

#include <absl/status/status.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "remat/cuda_api.h"
#include "remat/gradient_buckets.h"

namespace remat {

// Runs jobs one after the other on a thread of its own, in the order they came.
class ExchangeThread {
 public:
  ExchangeThread();
  ~ExchangeThread();  // runs what is queued first: every rank makes the same exchanges
  void submit(std::function<void()> job);
  void wait_for(std::size_t count);  // until the first `count` jobs have run

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> jobs_;
  std::size_t done_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: the members above exist before it starts
};

// Note [Buckets on the device] in device_buckets.cc.
class DeviceExchange {
 public:
  DeviceExchange() = default;
  ~DeviceExchange();
  DeviceExchange(const DeviceExchange&) = delete;
  DeviceExchange& operator=(const DeviceExchange&) = delete;

  // Ready for `buckets` buckets on `api`'s `device`, a failed rank's sending `stand_in`
  // bytes at most: grows what it holds where that is short (pinned memory and the stand-in
  // are freed and taken anew only then).
  void prepare(const std::shared_ptr<CudaApi>& api, int device, std::size_t buckets,
               std::size_t stand_in);
  void check(CudaResult r, const char* call) const;

  static constexpr std::size_t kZeroFloats = std::size_t{1} << 16;
  std::shared_ptr<CudaApi> api;
  int device = -1;
  CudaStream stream = nullptr;
  float* pinned = nullptr;  // kZeroFloats zeros, then each bucket's two flags
  std::size_t pinned_floats = 0;
  void* stand_in = nullptr;  // a failed rank's bucket and scratch, outside the budget
  std::size_t stand_in_bytes = 0;
  std::vector<CudaEvent> events;  // three per bucket: packed, begun, summed
};

struct GradientBuckets::Impl {
  struct Bucket {
    std::vector<std::size_t> params;   // in the order the bucket holds them
    std::vector<std::size_t> offsets;  // floats before each
    std::size_t floats = 0;            // the values, without the flag after them
    std::vector<Tensor> pending;       // per slot: gradients waiting for the bucket to fill
    std::vector<bool> came;            // per slot
    std::size_t arrived = 0;
    void* memory = nullptr;     // from the runtime's memory resource (CPU, simulated, CUDA)
    float* stand_in = nullptr;  // CUDA: a failed rank's, the exchange's (not owned)
    std::vector<float> host;    // on the host (GradientBucketOptions::on_host), or failed
    absl::Status status;        // the exchange's (on the host: written on the exchange thread)
    double exchange_seconds = 0;
    // CUDA with device collectives: the flag sent and the one summed (pinned host memory),
    // and the events that order the bucket's packing, its sum and its reading (Note
    // [Buckets on the device]); the exchange's.
    float* flag_in = nullptr;
    float* flag_out = nullptr;
    CudaEvent packed = nullptr, begun = nullptr, summed = nullptr;
    float* data() {
      if (memory != nullptr) return static_cast<float*>(memory);
      if (stand_in != nullptr) return stand_in;
      return host.data();
    }
    std::size_t bytes() const { return (floats + 1) * sizeof(float); }
  };

  Impl(Runtime& r, RankStep& s, std::vector<TensorSpec> sp, GradientBucketOptions o)
      : rt(r), ranks(s), specs(std::move(sp)), options(std::move(o)) {}

  void assign_buckets();
  std::exception_ptr start(std::size_t b);
  void* take_memory(std::size_t bytes, const std::string& what);
  void pack(Bucket& k, std::size_t b);
  void send_failed(Bucket& k);
  void exchange(Bucket& k);  // on the exchange thread
  void scale(Bucket& k) const;
  bool wait(Bucket& k, std::size_t b);
  void unpack(Bucket& k, std::vector<Tensor>& out);
  void give_back(Bucket& k);
  void give_back_scratch();
  bool in_runtime_memory() const;  // buckets from the budget (not on the host)

  // The device path (device_buckets.cc; Note [Buckets on the device]).
  bool on_device() const { return exchange_state != nullptr; }
  void open_device();
  void close_device();
  void pack_on_device(Bucket& k);
  void send_failed_on_device(Bucket& k);
  void exchange_on_device(Bucket& k);
  bool wait_on_device(Bucket& k);
  void unpack_on_device(Bucket& k, std::vector<Tensor>& out);
  void copy_zeros(float* dst, std::size_t floats, CudaStream s);

  Runtime& rt;
  RankStep& ranks;
  std::vector<TensorSpec> specs;
  GradientBucketOptions options;
  std::vector<Bucket> buckets;
  std::vector<std::pair<std::size_t, std::size_t>> slot_of;  // per parameter: bucket, slot
  std::size_t next = 0;                                      // the first bucket not started
  GradientBucketStats stats;
  std::unique_ptr<ExchangeThread> thread;  // the host path, where the ranks exchange
  // Device collectives' scratch: the most any bucket's sum asks for, from the budget while
  // the sums run (one area: the sums run one after another on the exchange stream).
  std::size_t scratch_floats = 0;
  void* scratch = nullptr;
  std::shared_ptr<DeviceExchange> exchange_state;  // the device path
};

}  // namespace remat

#endif  // REMAT_DRIVER_GRADIENT_BUCKETS_IMPL_H_
