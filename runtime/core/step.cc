// A training step: op positions, the signature, hints from a static plan, and the
// collaborators that record the step and follow the plan.
#include "runtime/core/step.h"

#include <absl/strings/str_cat.h>

#include <algorithm>

#include "runtime/core/plan_follower.h"
#include "runtime/core/step_recorder.h"

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

}  // namespace

// Hints make a hinted step where the policy acts on them (`hinted`): the runtime follows the
// plan's schedule where they carry one, evicts what the plan frees, and the policy weighs its
// scores by them. Other policies ignore hints.
Step::Step(StepHost& rt, StepOptions options, std::uint32_t stamp)
    : rt_(rt), stamp_(stamp), hints_(rt.uses_hints() ? std::move(options.hints) : nullptr) {
  if (options.record) recorder_ = std::make_unique<StepRecorder>(rt, *this, options.name);
  if (hints_ != nullptr && !hints_->schedule.empty())
    follower_ = std::make_unique<PlanFollower>(rt, *this);
}

Step::~Step() = default;

void Step::mark_backward() {
  if (phase_ == Phase::kBackward) return;
  phase_ = Phase::kBackward;
  if (recorder_) recorder_->mark_backward();
}

void Step::finish() {
  if (follower_ == nullptr) return;
  try {
    follower_->finish(position_);
  } catch (const OutOfMemoryError& e) {
    follower_->abandon();
    throw rt_.annotated(e);
  } catch (...) {
    follower_->abandon();
    throw;
  }
}

void Step::abandon() {
  if (follower_ != nullptr) follower_->abandon();
}

RecordedStep Step::result() {
  RecordedStep out;
  out.signature = signature_;
  if (recorder_) recorder_->finish(out);
  return out;
}

// Adds the op at `position` to the step's signature (its name and arities, then its shapes)
// and makes room for its outputs.
void Step::enter_position(const std::string& name, const std::vector<Id>& inputs,
                          std::span<const TensorSpec> outputs, int position) {
  StepSignature& sig = signature_;
  sig.structure = mix(mix(mix(sig.structure, hash_string(name)), inputs.size()), outputs.size());
  sig.shapes = mix(sig.shapes, sig.structure);
  for (Id t : inputs) sig.shapes = hash_spec(sig.shapes, rt_.tensor(t).spec);
  for (const TensorSpec& spec : outputs) sig.shapes = hash_spec(sig.shapes, spec);
  ++sig.ops;
  if (outputs_.size() <= static_cast<std::size_t>(position)) {
    outputs_.resize(static_cast<std::size_t>(position) + 1);
    ops_at_.resize(static_cast<std::size_t>(position) + 1, kNone);
  }
}

bool Step::is_step_tensor(Id t, int position, int output) const {
  const TensorRec& tr = rt_.tensor(t);
  return tr.step == stamp_ && tr.position == position && tr.output == output;
}

void Step::on_constant(Id t) {
  rt_.set_tensor_site(t, stamp_, -1, rt_.tensor(t).output);
  if (recorder_) recorder_->on_constant(t);
}

const OpHint* Step::place_op(Id op_id, int position) {
  rt_.set_op_site(op_id, stamp_, position);
  const OpRec& op = rt_.op(op_id);
  enter_position(op.op->name, op.inputs, op.output_specs, position);
  outputs_[static_cast<std::size_t>(position)] = op.outputs;
  ops_at_[static_cast<std::size_t>(position)] = op_id;
  for (std::size_t k = 0; k < op.outputs.size(); ++k)
    rt_.set_tensor_site(op.outputs[k], stamp_, position, static_cast<int>(k));
  if (recorder_) recorder_->record_call(op_id, position);
  if (hints_ == nullptr || static_cast<std::size_t>(position) >= hints_->ops.size()) return nullptr;
  const OpHint& hint = hints_->ops[static_cast<std::size_t>(position)];
  if (hint.op != op.op->name) {
    rt_.count_hint_mismatch();
    return nullptr;
  }
  for (std::size_t k = 0; k < op.outputs.size() && k < hint.outputs.size(); ++k) {
    const Id s = op.out_storages[k];
    if (s == kNone) continue;
    const OutputHint& h = hint.outputs[k];
    rt_.set_hint_weight(s, h.keep ? kKeepWeight : h.recomputed ? kRecomputeWeight : 1.0f);
  }
  return &hint;
}

// Sites, recording and hint weights first: the op's run (now, or when the plan it follows
// says) is then recorded at its position.
void Step::run_new_op(Id op_id, int position) {
  new_op_hint_ = place_op(op_id, position);
  new_op_followed_ = follower_ != nullptr && follower_->following();
  if (new_op_followed_) {
    follower_->follow(op_id, position, new_op_hint_);
  } else {
    rt_.run_op(op_id, /*recompute=*/false);
  }
}

// Outside a followed plan, what the plan frees once the op has run is evicted now.
void Step::after_new_op() {
  if (!new_op_followed_ && new_op_hint_ != nullptr) evict_hinted(*new_op_hint_);
  new_op_hint_ = nullptr;
}

void Step::evict_hinted(const OpHint& hint) {
  for (const StepSite& site : hint.evict_after) {
    if (site.position < 0 || static_cast<std::size_t>(site.position) >= outputs_.size()) continue;
    const auto& outs = outputs_[static_cast<std::size_t>(site.position)];
    if (site.output < 0 || static_cast<std::size_t>(site.output) >= outs.size()) continue;
    const Id t = outs[static_cast<std::size_t>(site.output)];
    if (t == kNone || !is_step_tensor(t, site.position, site.output)) continue;
    const Id s = rt_.tensor(t).storage;
    if (rt_.evictable(s)) rt_.evict_for_hint(s);
  }
}

bool Step::cancel_new_op(Id op) { return follower_ != nullptr && follower_->cancel_deferral(op); }

void Step::on_ran(Id op, bool first_run) {
  if (recorder_) recorder_->note_run(rt_.op(op), first_run);
  if (follower_) follower_->on_ran(op);
}

bool Step::holds_fresh(Id storage) {
  return follower_ != nullptr && follower_->holds_fresh(storage);
}

void Step::on_request_end() {
  if (follower_) follower_->on_request_end();
}

void Step::before_update(int position) {
  if (follower_) follower_->settle_before_update(position);
}

void Step::on_update(const OpDef& op, const std::vector<Id>& args, double cost, int position,
                     const std::vector<Id>& frozen) {
  enter_position(op.name, args, {}, position);
  if (recorder_) recorder_->record_update(op, args, cost, position, frozen);
}

void Step::on_host_read(Id tensor) {
  if (recorder_) recorder_->on_host_read(tensor);
}

void Step::on_handles_gone(Id tensor) {
  if (recorder_) recorder_->on_handles_gone(tensor);
}

void Step::on_destroyed(Id storage) {
  if (follower_) follower_->forget(storage);
}

// ---------------------------------------------------------------------------------------
// Following a schedule: where the plan's sites are in this step

Id Step::op_at(int position) const {
  if (position < 0 || static_cast<std::size_t>(position) >= ops_at_.size()) return kNone;
  const Id op = ops_at_[static_cast<std::size_t>(position)];
  if (op == kNone || rt_.op(op).step != stamp_ || rt_.op(op).position != position) return kNone;
  return op;
}

Id Step::site_tensor(const StepSite& site) const {
  if (site.position < 0 || static_cast<std::size_t>(site.position) >= outputs_.size()) return kNone;
  const auto& outs = outputs_[static_cast<std::size_t>(site.position)];
  if (site.output < 0 || static_cast<std::size_t>(site.output) >= outs.size()) return kNone;
  const Id t = outs[static_cast<std::size_t>(site.output)];
  return t != kNone && is_step_tensor(t, site.position, site.output) ? t : kNone;
}

}  // namespace remat::detail
