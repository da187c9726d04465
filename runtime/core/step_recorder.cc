// Recording a step as a remat-graph-v1 graph and a DTR log (RecordedStep).
#include "runtime/core/step_recorder.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cmath>

#include "runtime/core/step.h"

namespace remat::detail {
namespace {

std::uint64_t time_of(double cost) {
  return cost > 0 && std::isfinite(cost) ? static_cast<std::uint64_t>(std::llround(cost)) : 0;
}

}  // namespace

StepRecorder::StepRecorder(StepHost& rt, const Step& step, const std::string& name)
    : rt_(rt), step_(step) {
  graph_.name = name;
  graph_.source = "remat runtime recording";
  graph_.whole_groups = true;  // Note [Groups that run whole] in runtime/ir/schedule.cc
  trace_.name = name;
}

// The node of tensor `t` in the recording; a tensor made before the step becomes an input
// node (a CONSTANT of the trace) the first time the step reads it.
int StepRecorder::recorded_node(Id t) {
  const TensorRec& tr = rt_.tensor(t);
  if (tr.step == step_.stamp() && tr.node >= 0) return tr.node;
  const int node = graph_.size();
  Node n;
  n.id = node;
  n.name = absl::StrCat("input", node);
  n.op = "input";
  n.kind = NodeKind::kInput;
  n.phase = step_.phase();
  n.bytes = static_cast<std::int64_t>(tr.spec.bytes());
  graph_.nodes.push_back(std::move(n));
  trace_.handle_names.push_back(absl::StrCat("x", node));
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kConstant;
  in.results = {static_cast<std::uint32_t>(node)};
  in.bytes = {tr.spec.bytes()};
  trace_.instructions.push_back(std::move(in));
  if (tr.step != step_.stamp()) rt_.set_tensor_site(t, step_.stamp(), -1, tr.output);
  rt_.set_tensor_node(t, node);
  return node;
}

void StepRecorder::record_call(Id op_id, int position) {
  const OpRec& op = rt_.op(op_id);
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
  trace_.total_time_ns += in.time_ns;
  const std::size_t n = op.outputs.size();
  for (std::size_t k = 0; k < n; ++k) {
    const int node = graph_.size();
    Node g;
    g.id = node;
    g.name = absl::StrCat(op.op->name, "@", position, n > 1 ? absl::StrCat(".", k) : "");
    g.op = op.op->name;
    g.kind = op.alias_of[k] >= 0 ? NodeKind::kView : NodeKind::kCompute;
    g.phase = step_.phase();
    g.bytes = static_cast<std::int64_t>(op.output_specs[k].bytes());
    g.cost = std::max(0.0, op.cost) / static_cast<double>(n);
    g.inputs = input_nodes;
    if (n > 1) g.group = position;
    g.site_position = position;
    g.site_output = static_cast<int>(k);
    graph_.nodes.push_back(std::move(g));
    trace_.handle_names.push_back(absl::StrCat("x", node));
    in.results.push_back(static_cast<std::uint32_t>(node));
    in.bytes.push_back(op.output_specs[k].bytes());
    in.alias.push_back(op.alias_of[k]);
    const Id t = op.outputs[k];
    rt_.set_tensor_node(t, node);
    made_.emplace_back(t, node);
  }
  if (call_at_.size() <= static_cast<std::size_t>(position))
    call_at_.resize(static_cast<std::size_t>(position) + 1, {-1, -1});
  call_at_[static_cast<std::size_t>(position)] = {
      static_cast<int>(trace_.instructions.size()),
      n > 0 ? static_cast<int>(in.results.front()) : -1};
  trace_.instructions.push_back(std::move(in));
}

void StepRecorder::record_update(const OpDef& op, const std::vector<Id>& args, double cost,
                                 int position, const std::vector<Id>& frozen) {
  executed_.push_back(position);
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
    const Id producer = rt_.storage(s).producer;
    if (producer == kNone) continue;
    const OpRec& made = rt_.op(producer);
    for (std::size_t k = 0; k < made.outputs.size(); ++k) {
      if (made.out_storages[k] != s || made.alias_of[k] >= 0) continue;
      const TensorRec& tr = rt_.tensor(made.outputs[k]);
      if (tr.step != step_.stamp() || tr.node < 0) continue;
      in.args.push_back(static_cast<std::uint32_t>(tr.node));
      g.inputs.push_back(tr.node);
    }
  }
  std::sort(g.inputs.begin(), g.inputs.end());
  g.inputs.erase(std::unique(g.inputs.begin(), g.inputs.end()), g.inputs.end());
  in.time_ns = time_of(cost);
  trace_.total_time_ns += in.time_ns;
  g.id = graph_.size();
  g.name = absl::StrCat(op.name, "@", position);
  g.op = op.name;
  g.phase = step_.phase();
  g.cost = std::max(0.0, cost);
  g.recomputable = false;  // it wrote pinned memory in place
  g.site_position = position;
  graph_.nodes.push_back(std::move(g));
  trace_.handle_names.push_back(absl::StrCat("x", graph_.size() - 1));
  trace_.instructions.push_back(std::move(in));
}

void StepRecorder::note_run(const OpRec& op, bool first_run) {
  if (op.position < 0 || op.step != step_.stamp()) return;
  executed_.push_back(op.position);
  if (!first_run || static_cast<std::size_t>(op.position) >= call_at_.size()) return;
  const auto [call, first_node] = call_at_[static_cast<std::size_t>(op.position)];
  if (call < 0) return;
  DtrInstruction& in = trace_.instructions[static_cast<std::size_t>(call)];
  trace_.total_time_ns -= in.time_ns;
  in.time_ns = time_of(op.cost);
  trace_.total_time_ns += in.time_ns;
  const std::size_t n = op.outputs.size();
  for (std::size_t k = 0; first_node >= 0 && k < n; ++k)
    graph_.nodes[static_cast<std::size_t>(first_node) + k].cost =
        std::max(0.0, op.cost) / static_cast<double>(n);
}

// A value the program reads back (a loss it prints) is a result of the step even when its
// handle is gone by the end: a plan made from the recording must not free it before the
// read, which the graph would otherwise not show.
void StepRecorder::on_host_read(Id t) {
  const TensorRec& tr = rt_.tensor(t);
  if (tr.step == step_.stamp() && tr.node >= 0) host_read_.push_back(tr.node);
}

void StepRecorder::on_handles_gone(Id t) {
  const TensorRec& tr = rt_.tensor(t);
  if (tr.step != step_.stamp() || tr.node < 0) return;
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kRelease;
  in.dst = static_cast<std::uint32_t>(tr.node);
  trace_.instructions.push_back(std::move(in));
}

void StepRecorder::mark_backward() {
  DtrInstruction in;
  in.kind = DtrInstruction::Kind::kBackward;
  trace_.instructions.push_back(std::move(in));
}

// What the program still holds is what the step produced, with what it read back.
void StepRecorder::finish(RecordedStep& out) {
  for (auto [t, node] : made_) {
    const TensorRec& tr = rt_.tensor(t);
    if (tr.step == step_.stamp() && tr.node == node && tr.handles > 0)
      graph_.outputs.push_back(node);
  }
  graph_.outputs.insert(graph_.outputs.end(), host_read_.begin(), host_read_.end());
  std::sort(graph_.outputs.begin(), graph_.outputs.end());
  graph_.outputs.erase(std::unique(graph_.outputs.begin(), graph_.outputs.end()),
                       graph_.outputs.end());
  out.graph = std::move(graph_);
  out.trace = std::move(trace_);
  out.executed = std::move(executed_);
}

}  // namespace remat::detail
