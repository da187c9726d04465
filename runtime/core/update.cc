// In-place updates of pinned tensors (optimizers), and freezing what would read old values.
#include "runtime/core/runtime_impl.h"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <stdexcept>

namespace remat::detail {

// Note [Updating pinned tensors]
// Optimizers write parameters in place, and a parameter is read by the lineage of every
// activation and gradient of the step. If a tensor whose recomputation reads the old value
// were evicted and recomputed after the update, it would come back with new bits. So before
// an update writes a storage, every tensor that the user still holds and that depends on it
// (through any chain of ops whose intermediate results nobody holds) is made resident and
// frozen: pinned, so that it is never evicted and its producer never runs again. Nothing
// else needs freezing: a held tensor's dependents recompute from the frozen bits, and a
// tensor nobody holds and nothing live depends on will never be read. In a training loop
// the frozen tensors are the gradients and the loss; they are freed with their last handle.
// A recorded step shows the freeze as inputs of the update's node: whatever it froze must be
// resident when the update runs, which is what a plan of the step has to budget for.
namespace {
// Whether `op` reads storage `s` only as a constant it accumulates into.
bool only_accumulates_into(const OpRec& op, Id s) {
  if (op.accumulates.empty()) return false;
  for (std::size_t i = 0; i < op.in_storages.size(); ++i) {
    if (op.in_storages[i] != s) continue;
    if (std::find(op.accumulates.begin(), op.accumulates.end(), static_cast<int>(i)) ==
        op.accumulates.end())
      return false;
  }
  return true;
}
}  // namespace

std::vector<Id> RuntimeImpl::freeze_dependents(const std::vector<Id>& roots) {
  std::vector<Id> work = roots;
  std::vector<Id> frontier;
  absl::flat_hash_set<Id> seen(roots.begin(), roots.end());
  while (!work.empty()) {
    const Id s = work.back();
    work.pop_back();
    for (Id c : storages[s].consumers) {
      if (only_accumulates_into(ops[c], s)) continue;  // its outputs never read s's values
      for (Id out : ops[c].out_storages) {
        if (out == kNone || !seen.insert(out).second) continue;  // views share `s`'s storage
        const StorageRec& r = storages[out];
        if (r.pinned) continue;
        if (r.handles > 0) {
          frontier.push_back(out);
        } else {
          work.push_back(out);
        }
      }
    }
  }
  // The resident ones first, each moved out of the way of the recomputations that bring
  // back the others (Note [Packing pinned storages]).
  auto freeze = [&](Id s) {
    StorageRec& r = storages[s];
    r.pinned = true;
    stats.pinned_bytes += r.bytes;
    refresh_candidate(s);
    ++stats.frozen;
    pack_pinned(s);
  };
  for (Id s : frontier)
    if (storages[s].resident) freeze(s);
  for (Id s : frontier) {
    if (storages[s].pinned) continue;
    recompute_storage(s);
    freeze(s);
  }
  for (Id s : frontier)
    if (storages[s].producer != kNone) release_inputs_if_frozen(storages[s].producer);
  return frontier;
}

// Note [Frozen outputs free their inputs]
// A frozen storage never recomputes, so once every storage its producer makes is frozen, the
// producer never runs again and its inputs are needed by nobody through it. Kept, they
// would stay for as long as the frozen outputs do: an optimizer stepped inside the backward
// pass (register_post_accumulate_grad_hook) freezes the gradient flowing down at every
// parameter's update, and each frozen gradient would hold the one before it, pinned, down to
// the end of the pass. Released, the chain ends at the newest frozen gradient, as without the
// updates. The op's record stays (the frozen storages name their producer).
void RuntimeImpl::release_inputs_if_frozen(Id op_id) {
  OpRec& op = ops[op_id];
  if (op.inputs.empty() || op.deferred) return;
  bool makes_any = false;
  for (Id s : op.out_storages) {
    if (s == kNone) continue;
    if (!storages[s].pinned) return;
    makes_any = true;
  }
  if (!makes_any) return;  // a view: its outputs are its inputs' storages
  for (Id in : op.inputs) {
    auto& consumers = storages[tensors[in].storage].consumers;
    auto it = std::find(consumers.begin(), consumers.end(), op_id);
    if (it != consumers.end()) {
      *it = consumers.back();
      consumers.pop_back();
    }
  }
  std::vector<Id> inputs = std::move(op.inputs);
  op.inputs.clear();
  op.in_storages.clear();
  op.accumulates.clear();
  pending_tensors_.insert(pending_tensors_.end(), inputs.begin(), inputs.end());
  drain_tensor_refs();
}

// The storages an update writes: each mutated argument must be a constant.
std::vector<Id> RuntimeImpl::pinned_targets(const OpDef& op, const std::vector<Id>& args,
                                            std::span<const int> mutated) const {
  std::vector<Id> targets;
  for (int m : mutated) {
    if (m < 0 || m >= static_cast<int>(args.size()))
      throw std::invalid_argument(absl::StrCat("remat: op '", op.name, "' writes argument ", m,
                                               " of ", args.size(), " in place"));
    const Id s = tensors[args[static_cast<std::size_t>(m)]].storage;
    if (!storages[s].pinned || storages[s].producer != kNone)
      throw std::invalid_argument(absl::StrCat("remat: op '", op.name, "' argument ", m,
                                               " is not a constant; only pinned tensors are "
                                               "written in place (use call_inplace)"));
    targets.push_back(s);
  }
  return targets;
}

// Note [Accumulating into constants]
// A backward kernel of an existing loop writes an activation gradient and adds into
// parameter gradients (`dweight[i] += ...`) in one call (Runtime::call_accumulate). Its new
// outputs are ordinary lineage: they may be evicted and recomputed. Its accumulation must
// happen once: the kernel's extra outputs are the constants' own memory on its first run,
// and scratch on a recomputation, whose contents are thrown away (so the new outputs may not
// depend on what the constants held). Writing pinned memory, it is treated as an update
// before it runs: the step settles first (deferred ops run, so nothing that read the old
// values runs after it; a followed plan never defers it), and every held tensor whose
// recomputation reads the old values is frozen (not the outputs of other accumulations into
// them, which do not depend on what they held). Its first run counts in
// RuntimeStats::updates once its kernel is reached.
void RuntimeImpl::prepare_accumulation(const std::vector<Id>& targets, int position) {
  if (step) step->before_update(position - 1);
  freeze_dependents(targets);
  for (Id s : targets) discard_host_copy(s);  // the kernel writes them
}

void RuntimeImpl::update_pinned(const OpPtr& op, const std::vector<Id>& args,
                                std::span<const int> mutated) {
  const std::vector<Id> targets = pinned_targets(*op, args, mutated);
  if (runs_kernels && !has_kernel(*op))
    throw std::invalid_argument(
        absl::StrCat("remat: update op '", op->name, "' has no kernel for this backend"));
  const int position = step ? step->next_position() : -1;
  if (step) step->before_update(position);
  const std::vector<Id> frozen = freeze_dependents(targets);
  for (Id s : targets) discard_host_copy(s);  // the kernel writes them
  std::vector<Id> held;
  auto unlock_all = [&] {
    for (Id s : held) {
      storages[s].last_access = clock;
      unlock(s);
    }
  };
  double cost = 0;
  try {
    for (Id t : args) {
      make_resident(t);  // an OOM here is annotated with the op being recomputed
      lock(tensors[t].storage);
      held.push_back(tensors[t].storage);
    }
    std::vector<TensorSpec> specs;
    for (Id t : args) specs.push_back(tensors[t].spec);
    cost = std::max(declared_cost(*op, specs), 0.0);
    // The kernel's outputs are the mutated arguments' own memory.
    std::vector<const void*> in_ptrs;
    std::vector<const TensorSpec*> in_specs;
    std::vector<void*> outs;
    std::vector<const TensorSpec*> out_specs;
    KernelContext ctx;
    if (runs_kernels) {
      kernel_inputs(args, in_ptrs, in_specs);
      for (int m : mutated) {
        outs.push_back(const_cast<void*>(in_ptrs[static_cast<std::size_t>(m)]));
        out_specs.push_back(in_specs[static_cast<std::size_t>(m)]);
      }
      ctx = KernelContext{in_ptrs, in_specs, outs, out_specs, RngState{}, false};
    }
    ++stats.updates;  // pinned memory may be written from here on, even if the kernel fails
    cost = launch(*op, ctx, cost, /*measure=*/false, TimelineEvent::Kind::kCompute, 0);
  } catch (...) {
    unlock_all();
    throw;
  }
  ++stats.calls;
  stats.base_cost += cost;
  unlock_all();
  if (step) step->on_update(*op, args, cost, position, frozen);
}

}  // namespace remat::detail
