// Handles and the lifetime of lineage records.
#include "runtime/core/runtime_impl.h"

#include <algorithm>

namespace remat::detail {

void RuntimeImpl::retain(Id t) {
  TensorRec& tr = tensors[t];
  ++tr.handles;
  ++tr.refs;
  ++storages[tr.storage].handles;
}

void RuntimeImpl::release(Id t) {
  TensorRec& tr = tensors[t];
  if (--tr.handles == 0 && step) step->on_handles_gone(t);
  const Id s = tr.storage;
  --storages[s].handles;
  release_if_dead(s);
  drop_dead_offload(s);
  drop_tensor_ref(t);
}

// Note [Lineage lifetime]
// A tensor record lives while a user handle holds it or a live op reads it; a storage record
// lives while a tensor record points at it; an op record lives while one of its output
// tensor records or one of the storages it makes does (a view can keep a storage alive after
// its base tensor died, and the storage must stay recomputable). The memory of a storage is
// freed as soon as no handle can reach it, but its record and its producer stay for as long
// as some live tensor may need it recomputed. Dropping the last handle of a long chain can
// free the whole chain: the cascade runs on an explicit worklist, never by recursion.
void RuntimeImpl::drop_tensor_ref(Id t0) {
  pending_tensors_.push_back(t0);
  drain_tensor_refs();
}

void RuntimeImpl::release_op_ref(Id op_id) {
  drop_op_ref(op_id);
  drain_tensor_refs();
}

void RuntimeImpl::drain_tensor_refs() {
  while (!pending_tensors_.empty()) {
    const Id t = pending_tensors_.back();
    pending_tensors_.pop_back();
    TensorRec& tr = tensors[t];
    if (--tr.refs > 0) continue;
    const Id s = tr.storage;
    const Id producer = tr.producer;
    tensors.remove(t);
    if (producer != kNone) {
      OpRec& op = ops[producer];
      for (std::size_t k = 0; k < op.outputs.size(); ++k)
        if (op.outputs[k] == t) op.outputs[k] = op.output_storage[k] = kNone;
    }
    if (--storages[s].tensor_refs == 0) destroy_storage(s);
    if (producer != kNone) drop_op_ref(producer);
  }
}

// Drops one reference to an op; a dead op releases its inputs (onto the worklist).
void RuntimeImpl::drop_op_ref(Id op_id) {
  OpRec& op = ops[op_id];
  if (--op.refs > 0) return;
  for (Id in : op.inputs) {
    auto& consumers = storages[tensors[in].storage].consumers;
    auto it = std::find(consumers.begin(), consumers.end(), op_id);
    if (it != consumers.end()) {
      *it = consumers.back();
      consumers.pop_back();
    }
  }
  pending_tensors_.insert(pending_tensors_.end(), op.inputs.begin(), op.inputs.end());
  ops.remove(op_id);
}

void RuntimeImpl::destroy_storage(Id s) {
  StorageRec& r = storages[s];
  if (r.resident) {
    if (r.pinned) stats.pinned_bytes -= r.bytes;
    release_memory(s);
  }
  host_.drop(s);  // offloaded, or a copy begun while resident
  if (r.candidate_slot != kNone) {
    r.locks = 1;  // not evictable: takes it out of the candidates
    refresh_candidate(s);
  }
  policy->on_destroyed(s);
  if (step) step->on_destroyed(s);
  const Id producer = r.producer;
  storages.remove(s);
  if (producer != kNone) {
    OpRec& op = ops[producer];
    std::replace(op.out_storages.begin(), op.out_storages.end(), s, kNone);
    drop_op_ref(producer);
  }
}

}  // namespace remat::detail
