// A parameter whose AdamW state is split over the ranks of a data-parallel run (ZeRO stage 1,
// `--zero 1`): Note [Optimizer state in shards] in param_shards.cc.
//
//   ParamShards p = ParamShards::make(rt, host_param, rank, ranks);   // in make_state
//   Tensor w = p.whole(rt);              // each step: the parameter the forward pass reads
//   ...                                  // backward; the gradient summed over the ranks
//   p.update(rt, ranks, grad, adamw, step + 1);   // RankStep ranks; let go of w first
#ifndef REMAT_EXAMPLES_COMMON_PARAM_SHARDS_H_
#define REMAT_EXAMPLES_COMMON_PARAM_SHARDS_H_

#include <cstddef>
#include <vector>

#include "kernels/ops.h"
#include "remat/data_parallel.h"
#include "remat/runtime.h"
#include "remat/tensor.h"

namespace remat::examples {

class ParamShards {
 public:
  // The parameter `values` (null on the simulated backend) of `spec`, cut into `ranks` flat
  // chunks (sizes within one of each other), each a pinned constant; this rank's AdamW state
  // for its chunk alone. A parameter smaller than `ranks` stays whole, with its whole state,
  // and every rank updates it alike.
  static ParamShards make(Runtime& rt, const TensorSpec& spec, const float* values, int rank,
                          int ranks);

  // The parameter as the step reads it: the chunks joined and reshaped. Not pinned: the
  // runtime may evict it and join the chunks again.
  Tensor whole(Runtime& rt) const;
  // AdamW on this rank's chunk with its part of `grad` (the whole gradient, summed over the
  // ranks), then every rank's updated chunk from every rank.
  // Errors are kept in `ranks` (remat/data_parallel.h), which every rank's gather goes
  // through whatever failed on it.
  void update(Runtime& rt, RankStep& ranks, const Tensor& grad, const ops::AdamW& hp, int t);
  // The bytes of AdamW state this rank holds for the parameter.
  std::size_t state_bytes() const;
  // The parameter's values, where kernels run.
  std::vector<float> read(Runtime& rt) const;

 private:
  void gather(Runtime& rt, RankStep& ranks);

  TensorSpec spec_;
  std::vector<Tensor> chunks_;  // one per rank, or the whole parameter
  int own_ = 0;                 // the chunk this rank updates
  Tensor m_, v_;                // AdamW's moments for chunks_[own_]
};

}  // namespace remat::examples

#endif  // REMAT_EXAMPLES_COMMON_PARAM_SHARDS_H_
