// Note [Optimizer state in shards]
// ZeRO stage 1 kept as remat keeps everything: in the runtime, under the budget. A
// parameter's chunks are pinned constants, one per rank, and AdamW's moments exist for this
// rank's chunk only: with N ranks a rank pins the parameters and 2/N of their state, where
// one process pins the parameters and all of it. The step reads the parameter as the
// chunks joined (a concat, then a view), an ordinary tensor the runtime may evict and join
// again; after the backward pass (the gradient summed over the ranks) each rank runs AdamW
// on its chunk and the part of the gradient over it, and the updated chunks go to every
// rank, replacing the chunks it held. AdamW is elementwise, so every element ends with the
// bits the whole update gives.
#include "examples/common/param_shards.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace remat::examples {
namespace {

// Chunk r of n values in `parts`, as the collectives slice buffers.
std::int64_t chunk_begin(std::int64_t n, int r, int parts) {
  return static_cast<std::int64_t>(slice_begin(static_cast<std::size_t>(n), r, parts));
}

}  // namespace

ParamShards ParamShards::make(Runtime& rt, const TensorSpec& spec, const float* values, int rank,
                              int ranks) {
  ParamShards p;
  p.spec_ = spec;
  const std::int64_t n = spec.numel();
  const int parts = n >= ranks ? ranks : 1;
  const bool runs = values != nullptr;
  for (int r = 0; r < parts; ++r) {
    const std::int64_t at = chunk_begin(n, r, parts), len = chunk_begin(n, r + 1, parts) - at;
    p.chunks_.push_back(rt.constant({{len}}, runs ? values + at : nullptr));
  }
  p.own_ = parts == 1 ? 0 : rank;
  const std::int64_t len = p.chunks_[static_cast<std::size_t>(p.own_)].spec().numel();
  const std::vector<float> zero(runs ? static_cast<std::size_t>(len) : 0, 0.0f);
  p.m_ = rt.constant({{len}}, runs ? zero.data() : nullptr);
  p.v_ = rt.constant({{len}}, runs ? zero.data() : nullptr);
  return p;
}

Tensor ParamShards::whole(Runtime& rt) const {
  const Tensor flat = chunks_.size() == 1 ? chunks_[0] : ops::concat(rt, chunks_);
  return ops::reshape(rt, flat, spec_.shape);
}

void ParamShards::update(Runtime& rt, RankStep& ranks, const Tensor& grad, const ops::AdamW& hp,
                         int t) {
  const std::int64_t n = spec_.numel(), parts = static_cast<std::int64_t>(chunks_.size());
  const std::int64_t at = chunk_begin(n, own_, static_cast<int>(parts));
  const std::int64_t len = chunks_[static_cast<std::size_t>(own_)].spec().numel();
  ranks.run([&] {
    const Tensor flat = ops::reshape(rt, grad, {n});
    const Tensor part = parts == 1 ? flat : ops::narrow(rt, flat, at, {len});
    ops::adamw(rt, chunks_[static_cast<std::size_t>(own_)], m_, v_, part, hp, t);
  });
  if (parts > 1) gather(rt, ranks);
}

// Every rank's updated chunk, in rank order, replacing the chunks this rank held (the old
// constants go once nothing reads them), its own too: every rank then makes and frees the
// same sizes in the same order, so that the ranks' memory is laid out alike and their
// eviction decisions agree (Note [Ranks that agree] in driver/data_parallel.cc). Chunks are
// gathered padded to the longest; one rank alone has nothing to gather.
void ParamShards::gather(Runtime& rt, RankStep& ranks) {
  const bool runs = rt.options().backend != Backend::kSimulated;
  if (runs && !ranks.exchanges()) return;
  std::int64_t longest = 0;
  for (const Tensor& c : chunks_) longest = std::max(longest, c.spec().numel());
  const auto stride = static_cast<std::size_t>(longest);
  std::vector<float> own(runs ? stride : 0, 0.0f);
  if (runs) ranks.run([&] { rt.read(chunks_[static_cast<std::size_t>(own_)], own.data()); });
  const std::vector<float> all = ranks.all_gather(own);
  ranks.run([&] {
    for (std::size_t r = 0; r < chunks_.size(); ++r)
      chunks_[r] = rt.constant(chunks_[r].spec(), runs ? all.data() + r * stride : nullptr);
  });
}

std::size_t ParamShards::state_bytes() const { return m_.spec().bytes() + v_.spec().bytes(); }

std::vector<float> ParamShards::read(Runtime& rt) const {
  std::vector<float> out;
  for (const Tensor& c : chunks_) {
    std::vector<float> part(static_cast<std::size_t>(c.spec().numel()));
    rt.read(c, part.data());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

}  // namespace remat::examples
