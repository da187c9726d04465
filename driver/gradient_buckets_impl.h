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

struct GradientBuckets::Impl {
  struct Bucket {
    std::vector<std::size_t> params;   // in the order the bucket holds them
    std::vector<std::size_t> offsets;  // floats before each
    std::size_t floats = 0;            // the values, without the flag after them
    std::size_t scratch = 0;           // device collectives' scratch after the flag (floats)
    std::vector<Tensor> pending;       // per slot: gradients waiting for the bucket to fill
    std::vector<bool> came;            // per slot
    std::size_t arrived = 0;
    void* memory = nullptr;      // from the runtime's memory resource (CPU, simulated, CUDA)
    void* unbudgeted = nullptr;  // CUDA: a failed rank's device memory, outside the budget
    std::vector<float> host;     // CUDA without device collectives, or a failed rank's zeros
    absl::Status status;         // the exchange's (on the host: written on the exchange thread)
    double exchange_seconds = 0;
    // CUDA with device collectives: the flag sent and the one summed (pinned host memory),
    // and the events that order the bucket's packing, its sum and its reading (Note
    // [Buckets on the device]).
    float* flag_in = nullptr;
    float* flag_out = nullptr;
    CudaEvent packed = nullptr, begun = nullptr, summed = nullptr;
    float* data() {
      if (memory != nullptr) return static_cast<float*>(memory);
      if (unbudgeted != nullptr) return static_cast<float*>(unbudgeted);
      return host.data();
    }
    std::size_t bytes() const { return (floats + 1 + scratch) * sizeof(float); }
  };

  Impl(Runtime& r, RankStep& s, std::vector<TensorSpec> sp, GradientBucketOptions o)
      : rt(r), ranks(s), specs(std::move(sp)), options(o) {}

  void assign_buckets();
  std::exception_ptr start(std::size_t b);
  void take_memory(Bucket& k, std::size_t b);
  void pack(Bucket& k, std::size_t b);
  void send_failed(Bucket& k);
  void exchange(Bucket& k);  // on the exchange thread
  bool wait(Bucket& k, std::size_t b);
  void unpack(Bucket& k, std::vector<Tensor>& out);
  void give_back(Bucket& k);

  // The device path (device_buckets.cc; Note [Buckets on the device]).
  bool on_device() const { return api != nullptr; }
  void open_device();
  void close_device();
  void pack_on_device(Bucket& k);
  void send_failed_on_device(Bucket& k);
  void exchange_on_device(Bucket& k);
  bool wait_on_device(Bucket& k);
  void unpack_on_device(Bucket& k, std::vector<Tensor>& out);
  void give_back_on_device(Bucket& k);
  void copy_zeros(float* dst, std::size_t floats, CudaStream s);
  void check(CudaResult r, const char* call) const;

  Runtime& rt;
  RankStep& ranks;
  std::vector<TensorSpec> specs;
  GradientBucketOptions options;
  std::vector<Bucket> buckets;  // never resized once made: the device copies read flag_in
  std::vector<std::pair<std::size_t, std::size_t>> slot_of;  // per parameter: bucket, slot
  std::size_t next = 0;                                      // the first bucket not started
  GradientBucketStats stats;
  std::unique_ptr<ExchangeThread> thread;  // the host path, where the ranks exchange
  // The device path: the API, the device, the exchange stream, and pinned host memory for
  // the zeros copied from and the flags.
  std::shared_ptr<CudaApi> api;
  int device = 0;
  CudaStream stream = nullptr;
  float* pinned = nullptr;
  std::size_t zero_floats = 0;
};

}  // namespace remat

#endif  // REMAT_DRIVER_GRADIENT_BUCKETS_IMPL_H_
