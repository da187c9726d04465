// Steps: op positions, the signature, hints from a static plan, and recording a step as a
// remat-graph-v1 graph and a DTR log.
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>

#include "runtime/runtime_impl.h"

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
  step_ = StepState{};
  step_.active = true;
  step_.stamp = ++step_stamp_;
  if (policy->name() == "hinted") step_.hints = std::move(step_options.hints);
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
  if (step_.outputs.size() <= static_cast<std::size_t>(position))
    step_.outputs.resize(static_cast<std::size_t>(position) + 1);
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
  if (step_.recording) step_.recording->executed.push_back(position);
  enter_position(op.op->name, op.inputs, op.output_specs, position);
  step_.outputs[static_cast<std::size_t>(position)] = op.outputs;
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
  rec.trace.instructions.push_back(std::move(in));
}

void RuntimeImpl::on_update(const OpDef& op, const std::vector<Id>& args, double cost,
                            int position) {
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

void RuntimeImpl::on_handles_gone(Id t) {
  if (!step_.recording) return;
  const TensorRec& tr = tensors[t];
  if (tr.step != step_.stamp || tr.node < 0) return;
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kRelease;
  in.dst = static_cast<std::uint32_t>(tr.node);
  step_.recording->trace.instructions.push_back(std::move(in));
}

void RuntimeImpl::note_recomputed(const OpRec& op) {
  if (step_.recording && op.position >= 0 && op.step == step_.stamp)
    step_.recording->executed.push_back(op.position);
}

void RuntimeImpl::note_memory() {
  const MemoryStats m = memory->stats();
  timeline.memory.push_back({clock, m.allocated, m.reserved});
}

}  // namespace remat::detail
