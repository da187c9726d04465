// remat/gradient_buckets.h: a data-parallel step's gradients summed over the ranks in
// buckets, each bucket's sum started as soon as the backward pass has made its gradients,
// so that the exchange runs beside the rest of the backward pass.
//
//   remat::RankStep ranks(rt, &collectives);
//   remat::GradientBuckets buckets(rt, ranks, specs, {.bucket_bytes = 1 << 20, .scale = 0.5f});
//   ranks.run([&] {
//     tape.backward(loss, [&](int node, remat::Tensor g) {  // each gradient once it is final
//       buckets.add(param_of_node(node), std::move(g));
//     });
//   });
//   std::vector<remat::Tensor> grads = buckets.finish();  // summed over the ranks, scaled
//   ranks.run([&] { update(grads); });
//   ranks.agree();
//
// A bucket's memory comes from the runtime's memory resource, within its budget: a bucket
// is packed there when its last gradient comes (the gradients are then dropped), and the
// memory is given back once its sum is done and the summed gradients are made from it. On
// the CUDA backend with device collectives the bucket is device memory, packed and read on
// the runtime's stream and summed on a stream of the buckets' own, ordered by events; with
// none, it is packed into host memory.
#ifndef REMAT_GRADIENT_BUCKETS_H_
#define REMAT_GRADIENT_BUCKETS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "remat/data_parallel.h"
#include "remat/runtime.h"

namespace remat {

// What buckets on the device keep from one step to the next: the exchange stream, its
// events, pinned host memory for flags and zeros, and the device memory a failed rank sends
// from (outside the budget, so that a rank out of memory asks for none). A training loop
// makes one and passes it to every step's buckets, so that no step creates or frees them
// (freeing pinned memory waits for the whole device). Note [Buckets on the device].
class DeviceExchange;
std::shared_ptr<DeviceExchange> make_device_exchange();

struct GradientBucketOptions {
  // A bucket closes once its gradients reach this many bytes (a gradient larger than it is
  // a bucket of its own).
  std::size_t bucket_bytes = std::size_t{1} << 20;
  // Each sum is multiplied by it (1 / shards: the mean over the shards of the batch).
  float scale = 1.0f;
  // On the CUDA backend: the collectives over device memory (NCCL) the buckets are summed
  // with, on a stream of their own, each bucket in device memory within the budget, and
  // the scratch the sums work in too. Null: buckets go through host memory and the
  // RankStep's collectives.
  DeviceCollectives* device = nullptr;
  // With `device`: what the buckets keep from one step to the next (make_device_exchange).
  // Null: each step's buckets make their own, and free it at the step's end.
  std::shared_ptr<DeviceExchange> exchange = nullptr;
  // Buckets in host memory, outside the budget, as on the CUDA backend without `device`
  // (there always). A step rerun on the simulated backend (the step driver's recordings
  // and screenings) is given the options of the real one, so that both make the same
  // requests of the budget.
  bool on_host = false;
};

// What a step's buckets did: how many, their bytes, the seconds the exchange thread spent in
// sums (on CUDA: between events on the exchange stream), and the seconds finish() waited for
// them (what the backward pass did not hide).
struct GradientBucketStats {
  std::size_t buckets = 0;
  std::size_t bytes = 0;
  double exchange_seconds = 0;
  double wait_seconds = 0;
};

// Note [Buckets beside the backward pass] in driver/gradient_buckets.cc.
class GradientBuckets {
 public:
  // `specs`: the gradients of the step's parameters, float32, in parameter order. Buckets
  // take the parameters from the last to the first, the order a backward pass usually
  // finishes them; every rank must pass the same specs and options.
  GradientBuckets(Runtime& rt, RankStep& ranks, std::vector<TensorSpec> specs,
                  GradientBucketOptions options = {});
  ~GradientBuckets();  // waits for the sums in flight and gives their memory back
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // Parameter `i`'s gradient, final. Buckets start their sums in order: a bucket whose
  // gradients have all come starts once every bucket before it has. Throws out of memory
  // (naming the bucket) where its memory does not fit, invalid_argument on a gradient given
  // twice or of another spec.
  void add(std::size_t i, Tensor gradient);
  // Called once by every rank after its backward pass, whatever failed: starts the buckets
  // that have not started (with this rank's failed flag; the gradients that never came
  // count as zeros), waits for every sum, and returns the gradients summed over the ranks
  // and scaled, undefined for those that never came. Where any rank's flag came back set,
  // every rank throws the first failing rank's error (RankStep::agree). An exchange that
  // failed on this rank is kept in the RankStep, which the step's next agree() throws on
  // every rank.
  std::vector<Tensor> finish();

  std::size_t buckets() const;
  GradientBucketStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat

#endif  // REMAT_GRADIENT_BUCKETS_H_
