// GradientBuckets' device path: buckets in device memory, summed by device collectives
// (NCCL) on a stream of their own.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "driver/gradient_buckets_impl.h"
#include "remat/errors.h"
#include "remat/system_cuda.h"
#include "runtime/core/wall_clock.h"

// Note [Buckets on the device]
// With device collectives on the CUDA backend, a bucket is device memory from the runtime's
// memory resource (within the budget), and nothing waits on the host until finish():
//   - packing enqueues copies on the runtime's stream, from each gradient (Runtime::data,
//     valid in that stream's order) into the bucket, and the flag from the host; the
//     gradients are then dropped, their memory reused in that same stream's order;
//   - event `packed` on the runtime's stream; the exchange stream waits for it, records
//     `begun`, enqueues the sum (which multiplies by the scale, and works in the scratch
//     below), copies the summed flag to the host, and records `summed`;
//   - finish() waits for `summed` on the host (the wait the backward pass did not hide),
//     reads the flag, makes the runtime's stream wait for `summed`, and copies each summed
//     gradient into a new constant on the runtime's stream;
//   - the bucket's memory then goes back to the resource, which reuses it in the runtime's
//     stream's order, after those copies, themselves after the sum.
// So the kernels of the backward pass run while the exchange stream sums, and no memory is
// reused while another stream may still read it (Note [Stream-ordered reuse]). The zeros and
// flags copied to and from the host are in pinned memory: CUDA orders a copy from pageable
// memory by synchronizing the stream first, and one to pageable memory by waiting for it to
// end, so either would make the host wait for the kernels queued before it.
//
// The sums run one after another on the exchange stream, so one scratch area serves them
// all: the most any bucket's sum asks for, from the budget while the sums run. A rank that
// failed sends zeros and its flag from the exchange's stand-in, device memory outside the
// budget (its budget may be what failed), taken when the buckets open rather than at the
// failure: without it the other ranks would wait in the sum for good. What outlives a step
// (the stream, events, pinned memory, the stand-in) is a DeviceExchange the training loop
// keeps: made and freed every step, freeing pinned memory would wait for the whole device.
namespace remat {
namespace {

// Makes the runtime's device current for the buckets' calls, and restores the caller's.
class DeviceScope {
 public:
  DeviceScope(CudaApi& api, int device) : api_(api) {
    if (api_.get_device(&previous_).ok() && previous_ != device) api_.set_device(device);
  }
  ~DeviceScope() {
    int now = -1;
    if (previous_ >= 0 && api_.get_device(&now).ok() && now != previous_)
      api_.set_device(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  CudaApi& api_;
  int previous_ = -1;
};

}  // namespace

std::shared_ptr<DeviceExchange> make_device_exchange() {
  return std::make_shared<DeviceExchange>();
}

void DeviceExchange::check(CudaResult r, const char* call) const {
  if (!r.ok()) throw CudaError(call, r.code, r.message, "gradient buckets", device);
}

void DeviceExchange::prepare(const std::shared_ptr<CudaApi>& a, int d, std::size_t buckets,
                             std::size_t stand_in_size) {
  if (api != nullptr && (api != a || device != d))
    throw std::invalid_argument("gradient buckets: a DeviceExchange serves one device");
  api = a;
  device = d;
  DeviceScope scope(*api, device);
  if (stream == nullptr) check(api->stream_create(&stream), "cudaStreamCreate");
  if (const std::size_t floats = kZeroFloats + 2 * buckets; floats > pinned_floats) {
    if (pinned != nullptr) api->free_host(pinned);  // synchronizes the device: only to grow
    pinned = nullptr;
    pinned_floats = 0;
    void* p = nullptr;
    check(api->malloc_host(&p, floats * sizeof(float)), "cudaMallocHost");
    pinned = static_cast<float*>(p);
    pinned_floats = floats;
    std::memset(pinned, 0, floats * sizeof(float));
  }
  if (stand_in_size > stand_in_bytes) {
    if (stand_in != nullptr) api->free(stand_in);
    stand_in = nullptr;
    stand_in_bytes = 0;
    check(api->malloc(&stand_in, stand_in_size), "cudaMalloc");
    stand_in_bytes = stand_in_size;
  }
  while (events.size() < 3 * buckets) {
    CudaEvent e = nullptr;
    check(api->event_create(&e, true), "cudaEventCreate");
    events.push_back(e);
  }
}

DeviceExchange::~DeviceExchange() {
  if (api == nullptr) return;
  DeviceScope scope(*api, device);
  if (stream != nullptr) api->stream_synchronize(stream);
  for (CudaEvent e : events) api->event_destroy(e);
  if (stand_in != nullptr) api->free(stand_in);
  if (pinned != nullptr) api->free_host(pinned);
  if (stream != nullptr) api->stream_destroy(stream);
}

void GradientBuckets::Impl::open_device() {
  const CudaOptions& cuda = rt.options().cuda;
  std::shared_ptr<CudaApi> api = cuda.api != nullptr ? cuda.api : cuda_runtime_api();
  if (api == nullptr) throw std::invalid_argument("gradient buckets: this build has no CUDA");
  exchange_state = options.exchange != nullptr ? options.exchange : make_device_exchange();
  std::size_t largest = 0;
  for (const Bucket& k : buckets) largest = std::max(largest, k.bytes());
  exchange_state->prepare(api, cuda.device, buckets.size(),
                          largest + scratch_floats * sizeof(float));
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Bucket& k = buckets[b];
    k.flag_in = exchange_state->pinned + DeviceExchange::kZeroFloats + 2 * b;
    k.flag_out = k.flag_in + 1;
    k.packed = exchange_state->events[3 * b];
    k.begun = exchange_state->events[3 * b + 1];
    k.summed = exchange_state->events[3 * b + 2];
  }
}

// The sums queued on the exchange stream end before the buckets' memory goes back.
void GradientBuckets::Impl::close_device() {
  DeviceExchange& x = *exchange_state;
  DeviceScope scope(*x.api, x.device);
  x.api->stream_synchronize(x.stream);
}

// Copies zeros over `floats` floats at `dst`, on `s`, from the pinned zeros.
void GradientBuckets::Impl::copy_zeros(float* dst, std::size_t floats, CudaStream s) {
  const DeviceExchange& x = *exchange_state;
  for (std::size_t at = 0; at < floats; at += DeviceExchange::kZeroFloats) {
    const std::size_t n = std::min(DeviceExchange::kZeroFloats, floats - at);
    x.check(x.api->memcpy_async(dst + at, x.pinned, n * sizeof(float), CudaCopy::kHostToDevice, s),
            "cudaMemcpyAsync");
  }
}

void GradientBuckets::Impl::pack_on_device(Bucket& k) {
  const DeviceExchange& x = *exchange_state;
  DeviceScope scope(*x.api, x.device);
  const CudaStream runtime_stream = rt.stream();
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    float* dst = k.data() + k.offsets[s];
    const auto n = static_cast<std::size_t>(specs[k.params[s]].numel());
    if (!k.came[s]) {
      copy_zeros(dst, n, runtime_stream);
      continue;
    }
    const void* src = rt.data(k.pending[s]);  // no runtime call before the copy below
    x.check(
        x.api->memcpy_async(dst, src, n * sizeof(float), CudaCopy::kDeviceToDevice, runtime_stream),
        "cudaMemcpyAsync");
    k.pending[s] = Tensor();  // the bucket holds it now
  }
  *k.flag_in = 0.0f;
  x.check(x.api->memcpy_async(k.data() + k.floats, k.flag_in, sizeof(float),
                              CudaCopy::kHostToDevice, runtime_stream),
          "cudaMemcpyAsync");
}

// Zeros and the flag, in the stand-in, on the exchange stream: a failed bucket's sum comes
// after the one before it there, which may still read the stand-in.
void GradientBuckets::Impl::send_failed_on_device(Bucket& k) {
  const DeviceExchange& x = *exchange_state;
  DeviceScope scope(*x.api, x.device);
  k.stand_in = static_cast<float*>(x.stand_in);
  copy_zeros(k.data(), k.floats, x.stream);
  *k.flag_in = 1.0f;
  x.check(x.api->memcpy_async(k.data() + k.floats, k.flag_in, sizeof(float),
                              CudaCopy::kHostToDevice, x.stream),
          "cudaMemcpyAsync");
}

void GradientBuckets::Impl::exchange_on_device(Bucket& k) {
  const DeviceExchange& x = *exchange_state;
  DeviceScope scope(*x.api, x.device);
  x.check(x.api->event_record(k.packed, rt.stream()), "cudaEventRecord");
  x.check(x.api->stream_wait_event(x.stream, k.packed), "cudaStreamWaitEvent");
  x.check(x.api->event_record(k.begun, x.stream), "cudaEventRecord");
  // A failed bucket's scratch is the stand-in's, after its values and flag.
  float* work = k.stand_in != nullptr ? k.stand_in + k.floats + 1 : static_cast<float*>(scratch);
  k.status = options.device->all_reduce_sum(k.data(), k.floats + 1, options.scale, x.stream,
                                            {work, work != nullptr ? scratch_floats : 0});
  x.check(x.api->memcpy_async(k.flag_out, k.data() + k.floats, sizeof(float),
                              CudaCopy::kDeviceToHost, x.stream),
          "cudaMemcpyAsync");
  x.check(x.api->event_record(k.summed, x.stream), "cudaEventRecord");
}

bool GradientBuckets::Impl::wait_on_device(Bucket& k) {
  const DeviceExchange& x = *exchange_state;
  DeviceScope scope(*x.api, x.device);
  const auto t0 = std::chrono::steady_clock::now();
  x.check(x.api->event_synchronize(k.summed), "cudaEventSynchronize");
  stats.wait_seconds += detail::seconds_since(t0);
  float ms = 0;
  if (x.api->event_elapsed_ms(&ms, k.begun, k.summed).ok()) stats.exchange_seconds += ms / 1e3;
  x.check(x.api->stream_wait_event(rt.stream(), k.summed), "cudaStreamWaitEvent");
  return *k.flag_out > 0.0f;
}

// Note [Buckets on the device]: each summed gradient copied into a new constant, on the
// runtime's stream, which waits for the sum (wait_on_device).
void GradientBuckets::Impl::unpack_on_device(Bucket& k, std::vector<Tensor>& out) {
  const DeviceExchange& x = *exchange_state;
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    if (!k.came[s]) continue;
    const TensorSpec& spec = specs[k.params[s]];
    Tensor g = rt.constant(spec, nullptr);
    // A constant's bytes are the runtime's to write until it is read: the copy below is
    // ordered before any kernel that reads it, on the same stream.
    void* dst = const_cast<void*>(rt.data(g));
    DeviceScope scope(*x.api, x.device);
    x.check(x.api->memcpy_async(dst, k.data() + k.offsets[s], spec.bytes(),
                                CudaCopy::kDeviceToDevice, rt.stream()),
            "cudaMemcpyAsync");
    out[k.params[s]] = std::move(g);
  }
}

}  // namespace remat
