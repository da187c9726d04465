// What a call on the device does, for a cost model that reads no clock (Note [Costs without a
// clock] in op_work.cc).
#ifndef REMAT_PYTORCH_DETAIL_OP_WORK_H_
#define REMAT_PYTORCH_DETAIL_OP_WORK_H_

#include "pytorch/detail/torch_call.h"
#include "remat/op.h"

namespace remat::torch_backend::detail {

// The arithmetic and memory traffic of `call`, from its operator and its tensors' layouts.
OpWork estimated_work(const TorchCall& call);

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_OP_WORK_H_
