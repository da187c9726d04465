// The `simulated_cuda` execution (Note [Executions]): the runtime on a simulated CUDA device,
// each operator's CPU kernel run over the device's memory as a launch on the runtime's
// stream.
#include <absl/strings/str_cat.h>

#include <memory>
#include <utility>
#include <vector>

#include "pytorch/detail/execution.h"
#include "runtime/cuda/simulated_cuda.h"

namespace remat::torch_backend::detail {
namespace {

// The scratch a kernel takes, in order, for its launch's record of what it wrote. Work the
// stream ordered before the kernel that touches a scratch block (a copy out of memory freed
// and taken again) runs before the kernel writes it (Note [Host code run as a kernel]).
struct ScratchLog {
  void* (*take)(void* self, std::size_t bytes);
  void* self;
  SimulatedCuda* sim;
  CudaStream stream;
  std::vector<DeviceRange> blocks;

  static void* take_logged(void* log, std::size_t bytes) {
    auto* l = static_cast<ScratchLog*>(log);
    void* p = l->take(l->self, bytes);
    if (p == nullptr || bytes == 0) return p;
    l->blocks.push_back({p, bytes});
    const DeviceRange block[] = {{p, bytes}};
    l->sim->catch_up(l->stream, block);
    return p;
  }
};

// What the kernel of `k` reads and writes, as the launch records it.
void record_ranges(const KernelContext& k, std::vector<DeviceRange>& reads,
                   std::vector<DeviceRange>& writes) {
  for (std::size_t i = 0; i < k.inputs.size(); ++i)
    if (k.inputs[i] != nullptr && k.input_spec(i).bytes() > 0)
      reads.push_back({k.inputs[i], static_cast<std::size_t>(k.input_spec(i).bytes())});
  for (std::size_t i = 0; i < k.outputs.size(); ++i)
    if (k.outputs[i] != nullptr && k.output_spec(i).bytes() > 0)
      writes.push_back({k.outputs[i], static_cast<std::size_t>(k.output_spec(i).bytes())});
}

// A kernel's modelled time on the device: a microsecond, and a nanosecond per 100 bytes it
// touches (what the race detector and the device's clock need; costs are the policy's own).
double modelled_ns(const std::vector<DeviceRange>& reads, const std::vector<DeviceRange>& writes) {
  double bytes = 0;
  for (const DeviceRange& r : reads) bytes += static_cast<double>(r.bytes);
  for (const DeviceRange& w : writes) bytes += static_cast<double>(w.bytes);
  return 1000 + bytes / 100;
}

class SimulatedCudaExecution final : public Execution {
 public:
  // Capacity is a number only: the simulator allocates host memory as the runtime asks.
  SimulatedCudaExecution()
      : sim_(std::make_shared<SimulatedCuda>(
            SimulatedCudaOptions{.capacity = std::size_t{1} << 40})) {}
  std::string_view name() const override { return "simulated_cuda"; }

  void configure(RuntimeOptions& options) override {
    options.backend = remat::Backend::kCuda;
    options.cuda = CudaOptions{};
    options.cuda.api = sim_;
    options.cuda.blas_workspace_bytes = 4 << 10;  // no cuBLAS here: the least it takes
    options.cuda.launch = [sim = sim_.get()](const OpDef& op, const KernelContext& k) {
      launch(*sim, op, k);
    };
  }

  std::vector<std::string> problems() const override {
    std::vector<std::string> out;
    for (const Race& r : sim_->races()) out.push_back("race: " + r.what);
    for (const InvalidAccess& a : sim_->invalid_accesses())
      out.push_back("invalid access: " + a.what);
    return out;
  }
  void clear_problems() override {
    sim_->clear_races();
    sim_->clear_invalid_accesses();
  }
  std::size_t host_waits() const override { return sim_->host_waits(); }

  // A millisecond's read on a stream of its own, after what the runtime's stream has
  // enqueued so far (the bytes may not be written yet).
  void side_read(Runtime& rt, const Tensor& t, bool record_stream) override {
    if (side_ == nullptr) sim_->stream_create(&side_);
    const void* data = rt.data(t);
    CudaEvent written = nullptr;
    sim_->event_create(&written, false);
    sim_->event_record(written, rt.stream());
    sim_->stream_wait_event(side_, written);
    sim_->event_destroy(written);
    const DeviceRange read[] = {{data, static_cast<std::size_t>(t.spec().bytes())}};
    sim_->launch(side_, 1e6, read, {});
    if (record_stream) rt.record_stream(t, side_);
  }

 private:
  // Note [Host code run as a kernel]: the work the launch starts after runs first; the launch
  // is recorded without a body, with what it reads and writes, before the kernel runs on the
  // host (its scratch may call the device, whose time then passes: work on other streams is
  // checked against the launch before it completes); then its scratch is recorded, as a
  // launch of no time after it.
  static void launch(SimulatedCuda& sim, const OpDef& op, const KernelContext& k) {
    std::vector<DeviceRange> reads, writes;
    record_ranges(k, reads, writes);
    std::vector<DeviceRange> touched = reads;
    touched.insert(touched.end(), writes.begin(), writes.end());
    sim.catch_up(k.stream, touched);
    check(sim.launch(k.stream, modelled_ns(reads, writes), reads, writes, {}), op);
    ScratchLog log{k.scratch_fn, k.scratch_self, &sim, k.stream, {}};
    KernelContext logged = k;
    if (k.scratch_fn != nullptr) {
      logged.scratch_fn = &ScratchLog::take_logged;
      logged.scratch_self = &log;
    }
    op.kernel(logged);
    if (!log.blocks.empty()) check(sim.launch(k.stream, 0, {}, log.blocks, {}), op);
  }
  static void check(const CudaResult& r, const OpDef& op) {
    if (!r.ok()) throw std::runtime_error(absl::StrCat("remat_torch: ", op.name, ": ", r.message));
  }

  std::shared_ptr<SimulatedCuda> sim_;
  CudaStream side_ = nullptr;  // side_read's, made on first use
};

}  // namespace

std::unique_ptr<Execution> make_simulated_cuda_execution() {
  return std::make_unique<SimulatedCudaExecution>();
}

}  // namespace remat::torch_backend::detail
