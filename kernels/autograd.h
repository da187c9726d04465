// A gradient tape over the op library: each differentiable function runs its forward op
// through the runtime and records how to compute its input gradients; `backward` replays
// the records in reverse, releasing each one's saved tensors as soon as it has run, so
// activations die in the same order as in a hand-written backward pass.
//
//   remat::ad::Tape tape(rt);
//   remat::ad::Var w = tape.leaf(weight);                  // a parameter: its grad is kept
//   remat::ad::Var x = tape.input(batch);                  // no gradient
//   remat::ad::Var loss = remat::ad::cross_entropy_mean(tape, remat::ad::linear(tape, x, w),
//                                                       targets);
//   tape.backward(loss);
//   remat::Tensor dw = tape.grad(w);
//
// Saved tensors are ordinary runtime tensors: under a tight budget the runtime evicts them
// and recomputes them when the backward pass reads them.
#ifndef REMAT_KERNELS_AUTOGRAD_H_
#define REMAT_KERNELS_AUTOGRAD_H_

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "remat/runtime.h"

namespace remat::ad {

struct Var {
  Tensor value;
  int node = -1;  // -1: no gradient flows to it
  const TensorSpec& spec() const { return value.spec(); }
};

class Tape {
 public:
  explicit Tape(Runtime& rt) : rt_(rt) {}
  Runtime& rt() { return rt_; }

  Var leaf(Tensor t);  // a tensor whose gradient `backward` keeps
  Var input(Tensor t) { return Var{std::move(t), -1}; }

  // Gradient of a one-element `loss`, seeded with 1. Leaves' gradients are then in grad().
  void backward(const Var& loss);
  // The same, handing each leaf's gradient to `on_leaf_grad` (the leaf's node, its
  // gradient) as soon as no record left to run can add to it, instead of keeping it for
  // grad(): a data-parallel step starts summing gradients over the ranks while the backward
  // pass goes on (Note [Gradients ready early] in autograd.cc). Leaves no gradient reached
  // are never handed over.
  using LeafGradFn = std::function<void(int node, Tensor grad)>;
  void backward(const Var& loss, const LeafGradFn& on_leaf_grad);
  Tensor grad(const Var& leaf) const;

  // For the functions below: a new var made from `inputs`, with the closure that turns its
  // gradient into theirs (calling accumulate on those inputs only). No record when no input
  // needs a gradient.
  using BackwardFn = std::function<void(Tape&, const Tensor& grad)>;
  Var record(Tensor value, std::initializer_list<const Var*> inputs, BackwardFn fn);
  Var record(Tensor value, std::span<const Var> inputs, BackwardFn fn);
  // A record whose closure may accumulate into any var made before it.
  Var record(Tensor value, bool needs_grad, BackwardFn fn);
  void accumulate(int node, const Tensor& g);
  void accumulate(const Var& v, const Tensor& g) { accumulate(v.node, g); }

 private:
  struct Entry {
    int node;
    BackwardFn fn;
  };
  Var add_entry(Tensor value, BackwardFn fn);
  // `node` is an input of the entry about to be recorded.
  void note_input(int node);
  void hand_over(std::span<const int> leaves, const LeafGradFn& on_leaf_grad);

  Runtime& rt_;
  std::vector<Tensor> grads_;   // per node
  std::vector<bool> is_leaf_;   // per node
  std::vector<Entry> entries_;  // in forward order
  // Per node: the first entry that has it as an input (the last to add to its gradient in
  // the backward pass), or -1 while none has.
  std::vector<std::ptrdiff_t> first_reader_;
};

Var linear(Tape& t, const Var& x, const Var& w, const Var& b);
Var add(Tape& t, const Var& a, const Var& b);
Var mul(Tape& t, const Var& a, const Var& b);
Var scale(Tape& t, const Var& x, float s);
Var gelu(Tape& t, const Var& x);
Var relu(Tape& t, const Var& x);
Var sigmoid(Tape& t, const Var& x);
Var tanh(Tape& t, const Var& x);
Var layernorm(Tape& t, const Var& x, const Var& w, const Var& b);
Var attention(Tape& t, const Var& qkv, std::int64_t heads);
Var embedding(Tape& t, const Tensor& idx, const Var& wte, const Var& wpe);
Var dropout(Tape& t, const Var& x, float p);
Var conv2d(Tape& t, const Var& x, const Var& w, const Var& b, std::int64_t stride,
           std::int64_t pad);
struct BatchNormResult {
  Var y;
  Tensor mean, rstd;  // batch statistics, for ops::batchnorm_running_update
};
BatchNormResult batchnorm(Tape& t, const Var& x, const Var& gamma, const Var& beta);
Var maxpool2d(Tape& t, const Var& x, std::int64_t k, std::int64_t s);
Var avgpool(Tape& t, const Var& x);
Var reshape(Tape& t, const Var& x, std::vector<std::int64_t> shape);
Var narrow(Tape& t, const Var& x, std::int64_t offset, std::vector<std::int64_t> shape);
Var concat(Tape& t, const std::vector<Var>& parts);
// Mean over rows of the cross-entropy of logits (N, V) against int32 targets (N): a (1,) var.
Var cross_entropy_mean(Tape& t, const Var& logits, const Tensor& targets);

}  // namespace remat::ad

#endif  // REMAT_KERNELS_AUTOGRAD_H_
