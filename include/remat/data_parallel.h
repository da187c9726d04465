// remat/data_parallel.h: a training step's gradients summed over the processes of a
// data-parallel run (remat/collectives.h), inside a TrainingProgram's step.
//
//   remat::Tensor g = tape.grad(w);                          // this rank's shard's gradient
//   g = remat::all_reduce_sum(rt, collectives, g);           // every rank's, summed in order
//   g = remat::ops::scale(rt, g, 1.0f / collectives.size()); // the mean over the shards
//
// Where kernels run, the sum goes through host memory: `t` is read, summed, and made again as
// a constant of the same spec, which counts against the budget as `t` did. On the simulated
// backend (the step driver's screening, its recordings) nothing is exchanged: the result is a
// constant of the same spec, so the step makes the same requests there as for real.
#ifndef REMAT_DATA_PARALLEL_H_
#define REMAT_DATA_PARALLEL_H_

#include <exception>

#include "remat/collectives.h"
#include "remat/runtime.h"

namespace remat {

// `t` summed over the ranks of `collectives`, element by element in rank order (every rank
// gets the same bits). Throws std::runtime_error naming the collective that failed: a rank
// that cannot take part leaves the others waiting, so the run cannot go on.
Tensor all_reduce_sum(Runtime& rt, Collectives& collectives, const Tensor& t);

// Note [Ranks that agree]: every rank calls it at the same point of a step, with the error it
// caught in the part before it (null where none), before anything that waits on the other
// ranks. Where no rank failed it returns; where some did, every rank throws, so that none
// waits for a rank that left. A failing rank rethrows its own error; the others throw the
// error of the failing rank with the lowest number, naming that rank: an OutOfMemoryError or
// a ThrashError as the same type, so that every rank's step driver takes the same path
// (policy `auto` plans a first step DTR could not fit and runs it again, on every rank).
void agree_on_step(Collectives& collectives, std::exception_ptr failure);

}  // namespace remat

#endif  // REMAT_DATA_PARALLEL_H_
