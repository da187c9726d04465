// remat/data_parallel.h: the collectives of one data-parallel training step (remat/
// collectives.h) inside a TrainingProgram's step, with the ranks agreeing on failures.
//
//   remat::RankStep ranks(rt, &collectives);          // null collectives: this process alone
//   std::vector<remat::Tensor> grads;
//   ranks.run([&] { grads = forward_and_backward(); });  // an error is kept, not thrown
//   ranks.agree();                                    // so every rank has every gradient
//   for (remat::Tensor& g : grads) {
//     g = ranks.all_reduce_sum(g);                    // every rank's, summed in rank order
//     ranks.run([&] { g = remat::ops::scale(rt, g, 0.5f); });
//   }
//   ranks.run([&] { update(grads); });
//   ranks.agree();                                    // throws on every rank where one failed
//
// Where kernels run, sums and gathers go through host memory: a tensor is read, exchanged,
// and made again as a constant of the same spec, which counts against the budget as the
// tensor did. On the simulated backend (the step driver's screening, its recordings)
// nothing is exchanged and errors are thrown at once: results are constants of the same
// specs, so the step makes the same requests there as for real.
#ifndef REMAT_DATA_PARALLEL_H_
#define REMAT_DATA_PARALLEL_H_

#include <exception>
#include <functional>
#include <span>
#include <vector>

#include "remat/collectives.h"
#include "remat/runtime.h"

namespace remat {

// Note [Ranks that agree] in driver/data_parallel.cc: one step's collectives, which every
// rank enters whatever failed on it before, so that no rank waits for one that left.
class RankStep {
 public:
  // `collectives` null, of one rank, or `rt` on the simulated backend: no exchange, and
  // run() throws at once.
  RankStep(Runtime& rt, Collectives* collectives);

  // Runs `work` where no error was kept, keeping the one it throws.
  void run(const std::function<void()>& work);
  // `t` summed over the ranks, element by element in rank order (the same bits on every
  // rank). Where any rank has kept an error (before, or in reading `t`), every rank throws
  // the first failing rank's (agree_on_step). Undefined where making the result failed here
  // (kept for the next call or agree()).
  Tensor all_reduce_sum(const Tensor& t);
  // Every rank's `mine` (the same length on all), in rank order, where kernels run; empty
  // on the simulated backend. Throws as all_reduce_sum does.
  std::vector<float> all_gather(std::span<const float> mine);
  // Returns where no rank kept an error; otherwise every rank throws (agree_on_step). Where
  // what follows depends on the work before (the gradients a failed backward pass never
  // made), agreeing first keeps every rank making the same exchanges.
  void agree();
  bool exchanges() const { return collectives_ != nullptr; }
  // The collectives it exchanges over (null where it does not), and whether this rank has
  // kept an error.
  Collectives* collectives() const { return collectives_; }
  bool failed() const { return failure_ != nullptr; }

 private:
  // Throws on every rank where `any_failed` (a rank's flag went through the exchange).
  void agree_if(bool any_failed);

  Runtime& rt_;
  Collectives* collectives_;  // null: no exchange
  std::exception_ptr failure_;
};

// Where one rank failed, every rank throws; otherwise returns (Note [Ranks that agree]).
// Every rank calls it at the same point, with the error it kept (null where none): the
// failing rank with the lowest number throws its own, every other rank that error too,
// naming the rank (an OutOfMemoryError or a ThrashError as the same type), so that every
// rank's step driver takes the same path (StepDriverOptions::collectives).
void agree_on_step(Collectives& collectives, std::exception_ptr failure);

}  // namespace remat

#endif  // REMAT_DATA_PARALLEL_H_
