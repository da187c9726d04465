#include "remat/replay.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <chrono>

namespace remat {
namespace {

using Kind = DtrInstruction::Kind;

// Every op of a trace becomes an OpDef with no kernel: the simulated backend runs nothing.
class OpTable {
 public:
  const OpPtr& get(const std::string& name) {
    auto [it, fresh] = ops_.try_emplace(name);
    if (fresh) {
      auto op = std::make_shared<OpDef>();
      op->name = name;
      it->second = std::move(op);
    }
    return it->second;
  }

 private:
  absl::flat_hash_map<std::string, OpPtr> ops_;
};

TensorSpec bytes_spec(std::uint64_t bytes) {
  return TensorSpec{{static_cast<std::int64_t>(bytes)}, DType::kU8};
}

// Ops, by name, that run when called (ReplayOptions::run_when_called).
using NameSet = absl::flat_hash_set<std::string>;

// The trace's constants, in the order of its CONSTANT instructions.
std::vector<Tensor> make_constants(const DtrTrace& trace, Runtime& rt) {
  std::vector<Tensor> made;
  for (const DtrInstruction& in : trace.instructions)
    if (in.kind == Kind::kConstant) made.push_back(rt.constant(bytes_spec(in.bytes[0])));
  return made;
}

// Runs the trace's instructions on `rt`. Handles still alive at the end are the step's
// outputs and are made resident; they are returned, so that a recording sees them held.
// `constants`: the trace's, made before (make_constants); empty: each is made at its
// instruction.
std::vector<Tensor> run_trace(const DtrTrace& trace, Runtime& rt,
                              const NameSet& run_when_called = {},
                              const std::vector<Tensor>& constants = {}) {
  std::vector<Tensor> handles(trace.handle_names.size());
  OpTable ops;
  std::vector<Tensor> inputs;
  std::vector<Tensor*> args;
  Outputs outputs;
  std::size_t next_constant = 0;
  for (const DtrInstruction& in : trace.instructions) {
    const bool now = run_when_called.contains(in.op);
    switch (in.kind) {
      case Kind::kConstant:
        handles[in.results[0]] =
            constants.empty() ? rt.constant(bytes_spec(in.bytes[0])) : constants[next_constant++];
        break;
      case Kind::kCall: {
        for (std::uint32_t a : in.args) inputs.push_back(handles[a]);
        outputs.clear();
        for (std::size_t i = 0; i < in.results.size(); ++i) {
          outputs.emplace_back(bytes_spec(in.bytes[i]), in.alias[i]);
        }
        const std::size_t deferred = now ? rt.stats().deferred_ops : 0;
        std::vector<Tensor> made =
            rt.call_with(ops.get(in.op), inputs, outputs, static_cast<double>(in.time_ns));
        // The copies go now: kept until the next call, they would keep alive a tensor whose
        // handle the trace releases in between.
        inputs.clear();
        if (now && rt.stats().deferred_ops > deferred && !made.empty())
          rt.materialize(made.front());
        for (std::size_t i = 0; i < made.size(); ++i) handles[in.results[i]] = std::move(made[i]);
        break;
      }
      case Kind::kMutate: {
        args.clear();
        for (std::uint32_t a : in.args) args.push_back(&handles[a]);
        const std::size_t deferred = now ? rt.stats().deferred_ops : 0;
        rt.call_inplace(ops.get(in.op), args, in.mutate, static_cast<double>(in.time_ns));
        if (now && rt.stats().deferred_ops > deferred && !in.mutate.empty())
          rt.materialize(*args[static_cast<std::size_t>(in.mutate.front())]);
        break;
      }
      case Kind::kCopy:
      case Kind::kCopyFrom:
        handles[in.dst] = handles[in.src];
        break;
      case Kind::kRelease:
        handles[in.dst].reset();
        break;
      case Kind::kBackward:
        rt.mark_backward();
        break;
    }
  }
  for (const Tensor& h : handles) {
    if (h.defined()) rt.materialize(h);
  }
  return handles;
}

}  // namespace

ReplayBaseline replay_baseline(const DtrTrace& trace) {
  ReplayBaseline b;
  for (const DtrInstruction& in : trace.instructions)
    if (in.kind == Kind::kConstant) b.constant_bytes += in.bytes[0];
  for (Accounting acc : {Accounting::kLogical, Accounting::kAllocator}) {
    Runtime rt({.backend = Backend::kSimulated, .accounting = acc});
    run_trace(trace, rt);
    const RuntimeStats s = rt.stats();
    if (acc == Accounting::kLogical) {
      b.logical_peak_bytes = s.memory.peak_allocated;
    } else {
      b.reserved_peak_bytes = s.memory.peak_reserved;
    }
  }
  return b;
}

namespace {

// The simulated runtime a replay runs on.
RuntimeOptions replay_runtime(const DtrTrace& trace, const ReplayOptions& options) {
  RuntimeOptions ro;
  ro.backend = Backend::kSimulated;
  ro.accounting = options.accounting;
  ro.budget = options.budget;
  ro.policy = options.policy;
  ro.sample_candidates = options.sample_candidates;
  ro.contiguous_eviction = options.contiguous_eviction;
  ro.min_evictable_bytes = options.min_evictable_bytes;
  ro.allocator.expandable_segments = options.expandable_segments;
  ro.clock_limit = options.slowdown_cap * static_cast<double>(trace.total_time_ns);
  ro.record_timeline = options.record_timeline;
  ro.host_memory_bytes = options.host_memory_bytes;
  ro.host_link = options.host_link;
  return ro;
}

}  // namespace

ReplayResult replay(const DtrTrace& trace, const ReplayOptions& options) {
  ReplayResult r;
  r.budget_bytes = options.budget;
  const auto start = std::chrono::steady_clock::now();
  Runtime rt(replay_runtime(trace, options));
  try {
    const NameSet run_when_called(options.run_when_called.begin(), options.run_when_called.end());
    StepOptions step;
    step.hints = options.hints;
    step.record = options.record_executed;
    step.record_allocations = options.record_allocations;
    step.placement = options.placement;
    // A placement is laid out at the step's start beside what is live then: a program's
    // state, made before its step. Constants are not part of a sequence (Note [Placed
    // allocations]), wherever they are made.
    Tensor unread;
    if (options.unread_bytes > 0) unread = rt.constant(bytes_spec(options.unread_bytes));
    std::vector<Tensor> constants;
    if (options.record_allocations || options.placement) constants = make_constants(trace, rt);
    rt.begin_step(step);
    const std::vector<Tensor> outputs = run_trace(trace, rt, run_when_called, constants);
    r.executed = rt.end_step().executed;
    if (options.record_allocations) r.allocations = rt.take_allocation_sequence();
  } catch (const OutOfMemoryError& e) {
    r.status = "oom";
    r.error = e.what();
  } catch (const ThrashError& e) {
    r.status = "thrash";
    r.error = e.what();
  }
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const RuntimeStats s = rt.stats();
  r.peak_reserved_bytes = s.memory.peak_reserved;
  r.peak_allocated_bytes = s.memory.peak_allocated;
  r.fragmentation = s.memory.fragmentation();
  r.segment_reserves = s.memory.segment_reserves;
  r.segment_releases = s.memory.segment_releases;
  r.evictions = s.evictions;
  r.recomputations = s.recomputations;
  r.retried_requests = s.retried_requests;
  r.search_seconds = s.search_seconds;
  r.overhead = s.compute_overhead();
  r.hint_evictions = s.hint_evictions;
  r.deferred_ops = s.deferred_ops;
  r.placed_allocations = s.memory.placed_allocations;
  r.placement_misses = s.memory.placement_misses;
  r.offloads = s.offloads;
  r.restores = s.restores;
  r.transfer_seconds = s.transfer_cost * 1e-9;
  if (options.record_timeline) r.timeline = rt.timeline();
  r.simulated_seconds = rt.clock() * 1e-9;
  r.slowdown =
      trace.total_time_ns == 0 ? 1.0 : rt.clock() / static_cast<double>(trace.total_time_ns);
  return r;
}

RecordedStep record_replay(const DtrTrace& trace) {
  Runtime rt({.backend = Backend::kSimulated, .accounting = Accounting::kLogical});
  StepOptions step;
  step.record = true;
  step.name = trace.name;
  rt.begin_step(step);
  const std::vector<Tensor> outputs = run_trace(trace, rt);
  return rt.end_step();
}

}  // namespace remat
