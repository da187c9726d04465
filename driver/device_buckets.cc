// GradientBuckets' device path: buckets in device memory, summed by device collectives
// (NCCL) on a stream of their own.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "driver/gradient_buckets_impl.h"
#include "remat/errors.h"
#include "remat/system_cuda.h"

// Note [Buckets on the device]
// With device collectives on the CUDA backend, a bucket is device memory from the runtime's
// memory resource (within the budget), and nothing waits on the host until finish():
//   - packing enqueues copies on the runtime's stream, from each gradient (Runtime::data,
//     valid in that stream's order) into the bucket, and the flag from the host; the
//     gradients are then dropped, their memory reused in that same stream's order;
//   - event `packed` on the runtime's stream; the exchange stream waits for it, records
//     `begun`, enqueues the sum (which multiplies by the scale, and works in scratch the
//     engine asks for, after the flag in the bucket's memory: within the budget too),
//     copies the summed flag to the host, and records `summed`;
//   - finish() waits for `summed` on the host (the wait the backward pass did not hide),
//     reads the flag, makes the runtime's stream wait for `summed`, and copies each summed
//     gradient into a new constant on the runtime's stream;
//   - the bucket's memory then goes back to the resource, which reuses it in the runtime's
//     stream's order, after those copies, themselves after the sum.
// So the kernels of the backward pass run while the exchange stream sums, and no memory is
// reused while another stream may still read it (Note [Stream-ordered reuse]). The zeros and
// flags copied to and from the host are in pinned memory: CUDA orders a copy from pageable
// memory by synchronizing the stream first, and one to pageable memory by waiting for it to
// end, so either would make the host wait for the kernels queued before it. A rank that
// failed takes device memory outside the budget for its zeros and flag, since its budget
// may be what failed; without it the other ranks would wait in the sum for good.
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

void GradientBuckets::Impl::check(CudaResult r, const char* call) const {
  if (!r.ok()) throw CudaError(call, r.code, r.message, "gradient buckets", device);
}

void GradientBuckets::Impl::open_device() {
  const CudaOptions& cuda = rt.options().cuda;
  api = cuda.api != nullptr ? cuda.api : cuda_runtime_api();
  if (api == nullptr) throw std::invalid_argument("gradient buckets: this build has no CUDA");
  device = cuda.device;
  DeviceScope scope(*api, device);
  check(api->stream_create(&stream), "cudaStreamCreate");
  zero_floats = std::size_t{1} << 16;
  void* p = nullptr;
  check(api->malloc_host(&p, (zero_floats + 2 * buckets.size()) * sizeof(float)), "cudaMallocHost");
  pinned = static_cast<float*>(p);
  std::memset(pinned, 0, (zero_floats + 2 * buckets.size()) * sizeof(float));
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    buckets[b].flag_in = pinned + zero_floats + 2 * b;
    buckets[b].flag_out = buckets[b].flag_in + 1;
    buckets[b].scratch = options.device->sum_scratch_floats(buckets[b].floats + 1);
  }
}

void GradientBuckets::Impl::close_device() {
  DeviceScope scope(*api, device);
  api->stream_synchronize(stream);  // no sum in flight reads a bucket given back below
  for (Bucket& k : buckets) give_back_on_device(k);
  api->stream_destroy(stream);
  stream = nullptr;
  if (pinned != nullptr) api->free_host(pinned);  // synchronizes the device first
  pinned = nullptr;
}

// Copies zeros over `floats` floats at `dst`, on `s`, from the pinned zeros.
void GradientBuckets::Impl::copy_zeros(float* dst, std::size_t floats, CudaStream s) {
  for (std::size_t at = 0; at < floats; at += zero_floats) {
    const std::size_t n = std::min(zero_floats, floats - at);
    check(api->memcpy_async(dst + at, pinned, n * sizeof(float), CudaCopy::kHostToDevice, s),
          "cudaMemcpyAsync");
  }
}

void GradientBuckets::Impl::pack_on_device(Bucket& k) {
  DeviceScope scope(*api, device);
  const CudaStream runtime_stream = rt.stream();
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    float* dst = k.data() + k.offsets[s];
    const auto n = static_cast<std::size_t>(specs[k.params[s]].numel());
    if (!k.came[s]) {
      copy_zeros(dst, n, runtime_stream);
      continue;
    }
    const void* src = rt.data(k.pending[s]);  // no runtime call before the copy below
    check(api->memcpy_async(dst, src, n * sizeof(float), CudaCopy::kDeviceToDevice, runtime_stream),
          "cudaMemcpyAsync");
    k.pending[s] = Tensor();  // the bucket holds it now
  }
  *k.flag_in = 0.0f;
  check(api->memcpy_async(k.data() + k.floats, k.flag_in, sizeof(float), CudaCopy::kHostToDevice,
                          runtime_stream),
        "cudaMemcpyAsync");
}

void GradientBuckets::Impl::send_failed_on_device(Bucket& k) {
  DeviceScope scope(*api, device);
  check(api->malloc(&k.unbudgeted, k.bytes()), "cudaMalloc");
  copy_zeros(k.data(), k.floats, stream);
  *k.flag_in = 1.0f;
  check(api->memcpy_async(k.data() + k.floats, k.flag_in, sizeof(float), CudaCopy::kHostToDevice,
                          stream),
        "cudaMemcpyAsync");
}

void GradientBuckets::Impl::exchange_on_device(Bucket& k) {
  DeviceScope scope(*api, device);
  check(api->event_create(&k.packed, false), "cudaEventCreate");
  check(api->event_create(&k.begun, true), "cudaEventCreate");
  check(api->event_create(&k.summed, true), "cudaEventCreate");
  check(api->event_record(k.packed, rt.stream()), "cudaEventRecord");
  check(api->stream_wait_event(stream, k.packed), "cudaStreamWaitEvent");
  check(api->event_record(k.begun, stream), "cudaEventRecord");
  k.status = options.device->all_reduce_sum(k.data(), k.floats + 1, options.scale, stream,
                                            {k.data() + k.floats + 1, k.scratch});
  check(api->memcpy_async(k.flag_out, k.data() + k.floats, sizeof(float), CudaCopy::kDeviceToHost,
                          stream),
        "cudaMemcpyAsync");
  check(api->event_record(k.summed, stream), "cudaEventRecord");
}

bool GradientBuckets::Impl::wait_on_device(Bucket& k) {
  DeviceScope scope(*api, device);
  const auto t0 = std::chrono::steady_clock::now();
  check(api->event_synchronize(k.summed), "cudaEventSynchronize");
  stats.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float ms = 0;
  if (api->event_elapsed_ms(&ms, k.begun, k.summed).ok()) stats.exchange_seconds += ms / 1e3;
  check(api->stream_wait_event(rt.stream(), k.summed), "cudaStreamWaitEvent");
  return *k.flag_out > 0.0f;
}

// Note [Buckets on the device]: each summed gradient copied into a new constant, on the
// runtime's stream, which waits for the sum (wait_on_device).
void GradientBuckets::Impl::unpack_on_device(Bucket& k, std::vector<Tensor>& out) {
  for (std::size_t s = 0; s < k.params.size(); ++s) {
    if (!k.came[s]) continue;
    const TensorSpec& spec = specs[k.params[s]];
    Tensor g = rt.constant(spec, nullptr);
    // A constant's bytes are the runtime's to write until it is read: the copy below is
    // ordered before any kernel that reads it, on the same stream.
    void* dst = const_cast<void*>(rt.data(g));
    DeviceScope scope(*api, device);
    check(api->memcpy_async(dst, k.data() + k.offsets[s], spec.bytes(), CudaCopy::kDeviceToDevice,
                            rt.stream()),
          "cudaMemcpyAsync");
    out[k.params[s]] = std::move(g);
  }
}

void GradientBuckets::Impl::give_back_on_device(Bucket& k) {
  DeviceScope scope(*api, device);
  for (CudaEvent* e : {&k.packed, &k.begun, &k.summed}) {
    if (*e != nullptr) api->event_destroy(*e);
    *e = nullptr;
  }
  if (k.unbudgeted != nullptr) api->free(k.unbudgeted);  // synchronizes the device first
  k.unbudgeted = nullptr;
}

}  // namespace remat
