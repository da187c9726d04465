// Steps: op positions, the signature, hints from a static plan, and recording a step as a
// remat-graph-v1 graph and a DTR log.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>

#include "runtime/core/runtime_impl.h"

namespace remat::detail {
namespace {

// Note [Hinted eviction]
// The `hinted` policy is DTR's score with a factor per storage: a tensor the plan keeps as a
// checkpoint is worth kKeepWeight times its score, one the plan recomputes kRecomputeWeight
// times (lower scores go first). Beyond the weights, the runtime evicts at once what the plan
// frees once an op has run (OpHint::evict_after), so memory follows the plan's profile and
// the budget is rarely reached; when it is, the weighted scores decide as in DTR. The plan
// is only advice: under a budget it did not foresee (another sequence length) DTR's search
// still finds room, and results are exact whatever the hints say.
constexpr float kKeepWeight = 8.0f;
constexpr float kRecomputeWeight = 0.125f;

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

std::uint64_t hash_string(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::uint64_t hash_spec(std::uint64_t h, const TensorSpec& spec) {
  h = mix(h, static_cast<std::uint64_t>(spec.dtype));
  h = mix(h, spec.shape.size());
  for (std::int64_t d : spec.shape) h = mix(h, static_cast<std::uint64_t>(d));
  return h;
}

std::uint64_t time_of(double cost) {
  return cost > 0 && std::isfinite(cost) ? static_cast<std::uint64_t>(std::llround(cost)) : 0;
}

}  // namespace

void RuntimeImpl::begin_step(StepOptions step_options) {
  if (step_.active) end_step();  // runs what the unfinished step deferred
  step_ = StepState{};
  step_.active = true;
  step_.stamp = ++step_stamp_;
  if (policy->name() == "hinted") step_.hints = std::move(step_options.hints);
  step_.following = step_.hints != nullptr && !step_.hints->schedule.empty();
  if (step_options.record) {
    step_.recording = std::make_unique<Recording>();
    step_.recording->graph.name = step_options.name;
    step_.recording->graph.source = "remat runtime recording";
    step_.recording->trace.name = step_options.name;
  }
}

void RuntimeImpl::mark_backward() {
  if (!step_.active || step_.phase == Phase::kBackward) return;
  step_.phase = Phase::kBackward;
  if (step_.recording) {
    DtrInstruction in;
    in.kind = DtrInstruction::Kind::kBackward;
    step_.recording->trace.instructions.push_back(std::move(in));
  }
}

RecordedStep RuntimeImpl::end_step() {
  // Whatever the plan still computes, and every op still deferred, runs before the step
  // ends: a step's results are all computed once it is over.
  try {
    if (step_.following) run_remaining_plan(step_.position);
    run_deferred();
  } catch (const OutOfMemoryError& e) {
    abandon_step();
    throw annotated(e, current_op_);
  } catch (...) {
    abandon_step();
    throw;
  }
  free_lingering();
  RecordedStep out;
  out.signature = step_.signature;
  if (step_.recording) {
    Recording& rec = *step_.recording;
    // What the program still holds is what the step produced.
    for (auto [t, node] : rec.made) {
      const TensorRec& tr = tensors[t];
      if (tr.step == step_.stamp && tr.node == node && tr.handles > 0)
        rec.graph.outputs.push_back(node);
    }
    rec.graph.outputs.insert(rec.graph.outputs.end(), rec.host_read.begin(), rec.host_read.end());
    std::sort(rec.graph.outputs.begin(), rec.graph.outputs.end());
    rec.graph.outputs.erase(std::unique(rec.graph.outputs.begin(), rec.graph.outputs.end()),
                            rec.graph.outputs.end());
    out.graph = std::move(rec.graph);
    out.trace = std::move(rec.trace);
    out.executed = std::move(rec.executed);
  }
  step_ = StepState{};
  return out;
}

// Adds the op at `position` to the step's signature (its name and arities, then its shapes)
// and makes room for its outputs.
void RuntimeImpl::enter_position(const std::string& name, const std::vector<Id>& inputs,
                                 std::span<const TensorSpec> outputs, int position) {
  StepSignature& sig = step_.signature;
  sig.structure = mix(mix(mix(sig.structure, hash_string(name)), inputs.size()), outputs.size());
  sig.shapes = mix(sig.shapes, sig.structure);
  for (Id t : inputs) sig.shapes = hash_spec(sig.shapes, tensors[t].spec);
  for (const TensorSpec& spec : outputs) sig.shapes = hash_spec(sig.shapes, spec);
  ++sig.ops;
  if (step_.outputs.size() <= static_cast<std::size_t>(position)) {
    step_.outputs.resize(static_cast<std::size_t>(position) + 1);
    step_.ops_at.resize(static_cast<std::size_t>(position) + 1, kNone);
  }
}

int RuntimeImpl::next_position() { return step_.active ? step_.position++ : -1; }

bool RuntimeImpl::is_step_tensor(Id t, int position, int output) const {
  const TensorRec& tr = tensors[t];
  return tr.step == step_.stamp && tr.position == position && tr.output == output;
}

// The node of tensor `t` in the recording; a tensor made before the step becomes an input
// node (a CONSTANT of the trace) the first time the step reads it.
int RuntimeImpl::recorded_node(Id t) {
  TensorRec& tr = tensors[t];
  if (tr.step == step_.stamp && tr.node >= 0) return tr.node;
  Recording& rec = *step_.recording;
  const int node = rec.graph.size();
  Node n;
  n.id = node;
  n.name = absl::StrCat("input", node);
  n.op = "input";
  n.kind = NodeKind::kInput;
  n.phase = step_.phase;
  n.bytes = static_cast<std::int64_t>(tr.spec.bytes());
  rec.graph.nodes.push_back(std::move(n));
  rec.trace.handle_names.push_back(absl::StrCat("x", node));
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kConstant;
  in.results = {static_cast<std::uint32_t>(node)};
  in.bytes = {tr.spec.bytes()};
  rec.trace.instructions.push_back(std::move(in));
  if (tr.step != step_.stamp) {
    tr.step = step_.stamp;
    tr.position = -1;
  }
  tr.node = node;
  return node;
}

void RuntimeImpl::on_constant(Id t) {
  if (!step_.active) return;
  tensors[t].step = step_.stamp;
  tensors[t].position = -1;
  tensors[t].node = -1;
  if (step_.recording) recorded_node(t);
}

const OpHint* RuntimeImpl::on_new_op(Id op_id, int position) {
  if (position < 0) return nullptr;
  OpRec& op = ops[op_id];
  op.position = position;
  op.step = step_.stamp;
  enter_position(op.op->name, op.inputs, op.output_specs, position);
  step_.outputs[static_cast<std::size_t>(position)] = op.outputs;
  step_.ops_at[static_cast<std::size_t>(position)] = op_id;
  for (std::size_t k = 0; k < op.outputs.size(); ++k) {
    TensorRec& tr = tensors[op.outputs[k]];
    tr.step = step_.stamp;
    tr.position = position;
    tr.output = static_cast<std::int32_t>(k);
    tr.node = -1;
  }
  if (step_.recording) record_call(op_id, position);
  if (step_.hints == nullptr || static_cast<std::size_t>(position) >= step_.hints->ops.size())
    return nullptr;
  const OpHint& hint = step_.hints->ops[static_cast<std::size_t>(position)];
  if (hint.op != op.op->name) {
    ++stats.hint_mismatches;
    return nullptr;
  }
  for (std::size_t k = 0; k < op.outputs.size() && k < hint.outputs.size(); ++k) {
    const Id s = op.out_storages[k];
    if (s == kNone) continue;
    const OutputHint& h = hint.outputs[k];
    storages[s].hint_weight = h.keep ? kKeepWeight : h.recomputed ? kRecomputeWeight : 1.0f;
  }
  return &hint;
}

void RuntimeImpl::after_new_op(const OpHint* hint) {
  if (hint == nullptr) return;
  for (const StepSite& site : hint->evict_after) {
    if (site.position < 0 || static_cast<std::size_t>(site.position) >= step_.outputs.size())
      continue;
    const auto& outs = step_.outputs[static_cast<std::size_t>(site.position)];
    if (site.output < 0 || static_cast<std::size_t>(site.output) >= outs.size()) continue;
    const Id t = outs[static_cast<std::size_t>(site.output)];
    if (t == kNone || !is_step_tensor(t, site.position, site.output)) continue;
    const Id s = tensors[t].storage;
    if (!evictable(storages[s])) continue;
    evict(s);
    ++stats.hint_evictions;
  }
}

void RuntimeImpl::record_call(Id op_id, int position) {
  Recording& rec = *step_.recording;
  const OpRec& op = ops[op_id];
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kCall;
  in.op = op.op->name;
  std::vector<int> input_nodes;
  for (Id t : op.inputs) {
    const int node = recorded_node(t);
    in.args.push_back(static_cast<std::uint32_t>(node));
    input_nodes.push_back(node);
  }
  std::sort(input_nodes.begin(), input_nodes.end());
  input_nodes.erase(std::unique(input_nodes.begin(), input_nodes.end()), input_nodes.end());
  in.time_ns = time_of(op.cost);
  rec.trace.total_time_ns += in.time_ns;
  const std::size_t n = op.outputs.size();
  for (std::size_t k = 0; k < n; ++k) {
    const int node = rec.graph.size();
    Node g;
    g.id = node;
    g.name = absl::StrCat(op.op->name, "@", position, n > 1 ? absl::StrCat(".", k) : "");
    g.op = op.op->name;
    g.kind = op.alias_of[k] >= 0 ? NodeKind::kView : NodeKind::kCompute;
    g.phase = step_.phase;
    g.bytes = static_cast<std::int64_t>(op.output_specs[k].bytes());
    g.cost = std::max(0.0, op.cost) / static_cast<double>(n);
    g.inputs = input_nodes;
    if (n > 1) g.group = position;
    g.site_position = position;
    g.site_output = static_cast<int>(k);
    rec.graph.nodes.push_back(std::move(g));
    rec.trace.handle_names.push_back(absl::StrCat("x", node));
    in.results.push_back(static_cast<std::uint32_t>(node));
    in.bytes.push_back(op.output_specs[k].bytes());
    in.alias.push_back(op.alias_of[k]);
    const Id t = op.outputs[k];
    tensors[t].node = node;
    rec.made.emplace_back(t, node);
  }
  if (rec.call_at.size() <= static_cast<std::size_t>(position))
    rec.call_at.resize(static_cast<std::size_t>(position) + 1, {-1, -1});
  rec.call_at[static_cast<std::size_t>(position)] = {
      static_cast<int>(rec.trace.instructions.size()),
      n > 0 ? static_cast<int>(in.results.front()) : -1};
  rec.trace.instructions.push_back(std::move(in));
}

void RuntimeImpl::on_update(const OpDef& op, const std::vector<Id>& args, double cost,
                            int position, const std::vector<Id>& frozen) {
  if (position < 0) return;
  enter_position(op.name, args, {}, position);
  if (!step_.recording) return;
  Recording& rec = *step_.recording;
  rec.executed.push_back(position);
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kCall;
  in.op = op.name;
  Node g;
  for (Id t : args) {
    const int node = recorded_node(t);
    in.args.push_back(static_cast<std::uint32_t>(node));
    g.inputs.push_back(node);
  }
  // What the update froze is read too (Note [Updating pinned tensors]): a plan must have it
  // resident here. The trace's CALL takes it as arguments for the same reason.
  for (Id s : frozen) {
    const Id producer = storages[s].producer;
    if (producer == kNone) continue;
    const OpRec& made = ops[producer];
    for (std::size_t k = 0; k < made.outputs.size(); ++k) {
      if (made.out_storages[k] != s || made.alias_of[k] >= 0) continue;
      const TensorRec& tr = tensors[made.outputs[k]];
      if (tr.step != step_.stamp || tr.node < 0) continue;
      in.args.push_back(static_cast<std::uint32_t>(tr.node));
      g.inputs.push_back(tr.node);
    }
  }
  std::sort(g.inputs.begin(), g.inputs.end());
  g.inputs.erase(std::unique(g.inputs.begin(), g.inputs.end()), g.inputs.end());
  in.time_ns = time_of(cost);
  rec.trace.total_time_ns += in.time_ns;
  g.id = rec.graph.size();
  g.name = absl::StrCat(op.name, "@", position);
  g.op = op.name;
  g.phase = step_.phase;
  g.cost = std::max(0.0, cost);
  g.recomputable = false;  // it wrote pinned memory in place
  g.site_position = position;
  rec.graph.nodes.push_back(std::move(g));
  rec.trace.handle_names.push_back(absl::StrCat("x", rec.graph.size() - 1));
  rec.trace.instructions.push_back(std::move(in));
}

// A value the program reads back (a loss it prints) is a result of the step even when its
// handle is gone by the end: a plan made from the recording must not free it before the
// read, which the graph would otherwise not show.
void RuntimeImpl::on_host_read(Id t) {
  if (!step_.recording) return;
  const TensorRec& tr = tensors[t];
  if (tr.step == step_.stamp && tr.node >= 0) step_.recording->host_read.push_back(tr.node);
}

void RuntimeImpl::on_handles_gone(Id t) {
  if (!step_.recording) return;
  const TensorRec& tr = tensors[t];
  if (tr.step != step_.stamp || tr.node < 0) return;
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kRelease;
  in.dst = static_cast<std::uint32_t>(tr.node);
  step_.recording->trace.instructions.push_back(std::move(in));
}

void RuntimeImpl::note_run(const OpRec& op, bool first_run) {
  if (!step_.recording || op.position < 0 || op.step != step_.stamp) return;
  Recording& rec = *step_.recording;
  rec.executed.push_back(op.position);
  if (!first_run || static_cast<std::size_t>(op.position) >= rec.call_at.size()) return;
  const auto [call, first_node] = rec.call_at[static_cast<std::size_t>(op.position)];
  if (call < 0) return;
  DtrInstruction& in = rec.trace.instructions[static_cast<std::size_t>(call)];
  rec.trace.total_time_ns -= in.time_ns;
  in.time_ns = time_of(op.cost);
  rec.trace.total_time_ns += in.time_ns;
  const std::size_t n = op.outputs.size();
  for (std::size_t k = 0; first_node >= 0 && k < n; ++k)
    rec.graph.nodes[static_cast<std::size_t>(first_node) + k].cost =
        std::max(0.0, op.cost) / static_cast<double>(n);
}

// ---------------------------------------------------------------------------------------
// Following a schedule (Note [Following a schedule] in remat/hints.h)

Id RuntimeImpl::op_at(int position) const {
  if (position < 0 || static_cast<std::size_t>(position) >= step_.ops_at.size()) return kNone;
  const Id op = step_.ops_at[static_cast<std::size_t>(position)];
  if (op == kNone || ops[op].step != step_.stamp || ops[op].position != position) return kNone;
  return op;
}

Id RuntimeImpl::site_tensor(const StepSite& site) const {
  if (site.position < 0 || static_cast<std::size_t>(site.position) >= step_.outputs.size())
    return kNone;
  const auto& outs = step_.outputs[static_cast<std::size_t>(site.position)];
  if (site.output < 0 || static_cast<std::size_t>(site.output) >= outs.size()) return kNone;
  const Id t = outs[static_cast<std::size_t>(site.output)];
  return t != kNone && is_step_tensor(t, site.position, site.output) ? t : kNone;
}

// The new op starts deferred; the plan's steps up to its position run, its own first run
// among them unless the plan computes it after an op not called yet. A hint that does not
// match (another op, or past the plan's end) means the plan no longer describes the step:
// the cursor stops, and from here DTR's weighted scores decide alone.
void RuntimeImpl::follow_schedule(Id op_id, int position, const OpHint* hint) {
  if (hint == nullptr) {
    stop_following();
    run_frames(op_id, /*recompute=*/false);
    return;
  }
  try {
    if (ops[op_id].outputs.empty()) {
      // Nothing reads what it makes: it runs where the program calls it, after the plan's
      // steps before it (Note [Following a schedule]).
      run_plan_through(position - 1);
      run_frames(op_id, /*recompute=*/false);
      return;
    }
    OpRec& op = ops[op_id];
    op.deferred = true;
    ++op.refs;  // the op must outlive its outputs' handles until it has run
    for (Id t : op.inputs) ++storages[tensors[t].storage].pending_reads;
    step_.deferred.push_back(op_id);
    run_plan_through(position, op_id);
  } catch (...) {
    stop_following();
    throw;
  }
  if (!ops[op_id].deferred) return;
  ++stats.deferred_ops;
  for (Id s : ops[op_id].out_storages)
    if (s != kNone) policy->on_evicted(s);  // born evicted, as far as the policy can tell
}

// The plan's steps from the cursor on, while they name ops at positions up to `last`.
// With `called` (the op the program is calling, at position `last`), the cursor stops once
// that op has run: the steps after it wait for the program's next call, update or end of
// step. Until the call returns, the program still holds handles to what the plan has
// already dropped (a result freed at its own step, say); letting it release them first
// keeps memory at the plan's profile instead of above it during the steps that follow.
void RuntimeImpl::run_plan_through(int last, Id called) {
  const std::vector<PlanStep>& plan = step_.hints->schedule;
  while (step_.cursor < plan.size() && plan[step_.cursor].site.position <= last) {
    run_plan_step(plan[step_.cursor++]);
    const bool ran_called = called != kNone && !ops[called].deferred &&
                            plan[step_.cursor - 1].site.position == last;
    // (The op's other outputs' steps, which come next in the plan, still run now.)
    if (ran_called && (step_.cursor == plan.size() || plan[step_.cursor].site.position != last))
      return;
  }
}

// One computation of the plan: a deferred op's first run, or an evicted output recomputed;
// then the frees the plan makes there. What is already as the plan wants is left alone.
// Storages the step's op makes stay resident (plan_spec) until the plan claims them as
// instances (plan_refs) and frees them, so that a dead tensor the plan recomputes for later
// steps is not freed by the first op that reads it.
void RuntimeImpl::run_plan_step(const PlanStep& step) {
  const Id op = op_at(step.site.position);
  Id root = kNone;
  bool recompute = false;
  if (op != kNone && ops[op].deferred) {
    root = op;
  } else if (const Id t = site_tensor(step.site); t != kNone) {
    const Id s = tensors[t].storage;
    if (!storages[s].resident && storages[s].producer != kNone) {
      root = storages[s].producer;
      recompute = true;
    }
  }
  if (root != kNone) {
    current_op_ = ops[root].op->name;
    plan_run_ = true;
    try {
      run_frames(root, recompute);
    } catch (...) {
      plan_run_ = false;
      throw;
    }
    plan_run_ = false;
  }
  if (const Id t = site_tensor(step.site); t != kNone && storages[tensors[t].storage].resident)
    claim_for_plan(tensors[t].storage);
  for (const StepSite& site : step.free_after) free_planned(site, /*evict=*/true);
  for (const StepSite& site : step.drop_after) free_planned(site, /*evict=*/false);
}

void RuntimeImpl::claim_for_plan(Id s) {
  StorageRec& r = storages[s];
  if (r.plan_refs == 0 && !r.plan_spec) step_.plan_storages.push_back(s);
  ++r.plan_refs;
  r.plan_spec = false;
}

// The plan no longer says what happens next: its holds end, and dead storages go.
void RuntimeImpl::stop_following() {
  step_.following = false;
  std::vector<Id> held;
  held.swap(step_.plan_storages);
  for (Id s : held) {
    storages[s].plan_refs = 0;
    storages[s].plan_spec = false;
  }
  for (Id s : held) release_if_dead(s);
}

// A storage nothing will read before the plan's next instance of it: freed outright when no
// handle holds it and no deferred op waits for it, else evicted (it stays recomputable) unless
// it is a result the program may still read (`evict_held` false).
void RuntimeImpl::free_planned(const StepSite& site, bool evict_held) {
  const Id t = site_tensor(site);
  if (t == kNone) return;
  const Id s = tensors[t].storage;
  StorageRec& r = storages[s];
  if (r.plan_refs > 0 && --r.plan_refs > 0) return;  // a view or its base still lives in the plan
  r.plan_spec = false;
  if (r.handles == 0 && r.pending_reads == 0) {
    release_if_dead(s);
    return;
  }
  if (!evict_held || !evictable(r)) return;
  evict(s);
  ++stats.hint_evictions;
}

// The plan's steps left, for ops the program has called (positions before `end`).
void RuntimeImpl::run_remaining_plan(int end) {
  const std::vector<PlanStep>& plan = step_.hints->schedule;
  while (step_.cursor < plan.size()) {
    const PlanStep& step = plan[step_.cursor++];
    if (step.site.position < end) run_plan_step(step);
  }
  stop_following();
}

// Every op still deferred, in the order the program called them.
void RuntimeImpl::run_deferred() {
  for (std::size_t i = 0; i < step_.deferred.size(); ++i) {
    const Id op = step_.deferred[i];
    if (!ops[op].deferred) continue;
    current_op_ = ops[op].op->name;
    run_frames(op, /*recompute=*/false);
  }
  step_.deferred.clear();
}

// An update writes parameters in place: what the plan computes before it runs first, and
// no op that may read the old values is left deferred past it.
void RuntimeImpl::settle_before_update(int position) {
  if (!step_.active || (step_.deferred.empty() && !step_.following)) return;
  try {
    if (step_.following) run_plan_through(position);
    run_deferred();
  } catch (const OutOfMemoryError& e) {
    stop_following();
    throw annotated(e, current_op_);
  } catch (...) {
    stop_following();
    throw;
  }
}

void RuntimeImpl::undefer(Id op_id) {
  OpRec& op = ops[op_id];
  op.deferred = false;
  for (Id t : op.inputs) --storages[tensors[t].storage].pending_reads;
  undeferred_.push_back(op_id);  // its extra reference goes once the request is over
}

void RuntimeImpl::drop_undeferred() {
  std::vector<Id> done;
  done.swap(undeferred_);
  for (Id op : done) release_op_ref(op);
}

// A step that failed to finish: nothing stays deferred or held by the plan.
void RuntimeImpl::abandon_step() {
  stop_following();
  for (Id op : step_.deferred)
    if (cancel_deferral(op)) release_op_ref(op);
  step_ = StepState{};
}

bool RuntimeImpl::cancel_deferral(Id op_id) {
  OpRec& op = ops[op_id];
  if (!op.deferred) return false;
  op.deferred = false;
  for (Id t : op.inputs) {
    const Id s = tensors[t].storage;
    --storages[s].pending_reads;
    release_if_dead(s);
  }
  return true;
}

void RuntimeImpl::note_memory() {
  const MemoryStats m = memory->stats();
  timeline.memory.push_back({clock, m.allocated, m.reserved});
}

}  // namespace remat::detail
