#include "kernels/autograd.h"

#include <algorithm>
#include <span>
#include <stdexcept>
#include <vector>

namespace remat::ad {

// Note [Gradients ready early]
// A data-parallel step sums each parameter's gradient over the ranks; started as soon as the
// gradient is final, the sums run beside the rest of the backward pass. A leaf's gradient
// is final once the backward pass has run every record that has the leaf as an input: the
// records run in reverse forward order, so that is the first record made with it
// (first_reader_). Records that name no inputs (record with `needs_grad`) may add to any
// earlier var: they count as reading every var made before them.
Var Tape::leaf(Tensor t) {
  const int node = static_cast<int>(grads_.size());
  grads_.emplace_back();
  is_leaf_.push_back(true);
  first_reader_.push_back(-1);
  return Var{std::move(t), node};
}

void Tape::note_input(int node) {
  if (node < 0) return;
  std::ptrdiff_t& first = first_reader_[static_cast<std::size_t>(node)];
  if (first < 0) first = static_cast<std::ptrdiff_t>(entries_.size());
}

Var Tape::record(Tensor value, std::initializer_list<const Var*> inputs, BackwardFn fn) {
  bool needed = false;
  for (const Var* v : inputs) needed |= v != nullptr && v->node >= 0;
  if (!needed) return Var{std::move(value), -1};
  for (const Var* v : inputs)
    if (v != nullptr) note_input(v->node);
  return add_entry(std::move(value), std::move(fn));
}

Var Tape::record(Tensor value, std::span<const Var> inputs, BackwardFn fn) {
  bool needed = false;
  for (const Var& v : inputs) needed |= v.node >= 0;
  if (!needed) return Var{std::move(value), -1};
  for (const Var& v : inputs) note_input(v.node);
  return add_entry(std::move(value), std::move(fn));
}

Var Tape::record(Tensor value, bool needs_grad, BackwardFn fn) {
  if (!needs_grad) return Var{std::move(value), -1};
  for (std::size_t node = 0; node < grads_.size(); ++node) note_input(static_cast<int>(node));
  return add_entry(std::move(value), std::move(fn));
}

Var Tape::add_entry(Tensor value, BackwardFn fn) {
  const int node = static_cast<int>(grads_.size());
  grads_.emplace_back();
  is_leaf_.push_back(false);
  first_reader_.push_back(-1);
  entries_.push_back(Entry{node, std::move(fn)});
  return Var{std::move(value), node};
}

void Tape::accumulate(int node, const Tensor& g) {
  if (node < 0) return;
  Tensor& slot = grads_[static_cast<std::size_t>(node)];
  slot = slot.defined() ? ops::add(rt_, slot, g) : g;
}

void Tape::backward(const Var& loss) { backward(loss, nullptr); }

void Tape::backward(const Var& loss, const LeafGradFn& on_leaf_grad) {
  if (loss.node < 0) throw std::invalid_argument("remat: backward of a var that needs no gradient");
  if (loss.spec().numel() != 1)
    throw std::invalid_argument("remat: backward needs a one-element loss");
  const float one = 1.0f;
  grads_[static_cast<std::size_t>(loss.node)] = rt_.constant(TensorSpec{{1}, DType::kF32}, &one);
  // Reverse forward order is a topological order of the recorded graph. Each record is
  // dropped once it has run, releasing what it saved.
  std::vector<std::vector<int>> final_after(on_leaf_grad ? entries_.size() : 0);
  for (std::size_t node = 0; on_leaf_grad && node < grads_.size(); ++node)
    if (is_leaf_[node] && first_reader_[node] >= 0)
      final_after[static_cast<std::size_t>(first_reader_[node])].push_back(static_cast<int>(node));
  for (std::size_t e = entries_.size(); e-- > 0;) {
    Entry& entry = entries_[e];
    Tensor g = std::move(grads_[static_cast<std::size_t>(entry.node)]);
    grads_[static_cast<std::size_t>(entry.node)] = Tensor();
    BackwardFn fn = std::move(entry.fn);
    entry.fn = nullptr;
    if (g.defined()) fn(*this, g);
    if (on_leaf_grad) hand_over(final_after[e], on_leaf_grad);
  }
  entries_.clear();
  // The records are gone: a tape used again reads its vars anew.
  std::fill(first_reader_.begin(), first_reader_.end(), -1);
}

void Tape::hand_over(std::span<const int> leaves, const LeafGradFn& on_leaf_grad) {
  for (int node : leaves) {
    Tensor g = std::move(grads_[static_cast<std::size_t>(node)]);
    grads_[static_cast<std::size_t>(node)] = Tensor();
    if (g.defined()) on_leaf_grad(node, std::move(g));
  }
}

Tensor Tape::grad(const Var& leaf) const {
  if (leaf.node < 0 || !is_leaf_[static_cast<std::size_t>(leaf.node)])
    throw std::invalid_argument("remat: grad() of a var that is not a leaf of this tape");
  return grads_[static_cast<std::size_t>(leaf.node)];
}

// ---------------------------------------------------------------------------------------

Var linear(Tape& t, const Var& x, const Var& w, const Var& b) {
  Runtime& rt = t.rt();
  Tensor y = ops::linear(rt, x.value, w.value, b.value);
  return t.record(std::move(y), {&x, &w, &b}, [x, w, b](Tape& tp, const Tensor& g) {
    Runtime& r = tp.rt();
    if (b.node >= 0) tp.accumulate(b, ops::bias_grad(r, g));
    if (w.node >= 0) tp.accumulate(w, ops::matmul(r, g, x.value, true, false));
    if (x.node >= 0) tp.accumulate(x, ops::matmul(r, g, w.value, false, false));
  });
}

Var add(Tape& t, const Var& a, const Var& b) {
  return t.record(ops::add(t.rt(), a.value, b.value), {&a, &b},
                  [an = a.node, bn = b.node](Tape& tp, const Tensor& g) {
                    tp.accumulate(an, g);
                    tp.accumulate(bn, g);
                  });
}

Var mul(Tape& t, const Var& a, const Var& b) {
  return t.record(ops::mul(t.rt(), a.value, b.value), {&a, &b}, [a, b](Tape& tp, const Tensor& g) {
    if (a.node >= 0) tp.accumulate(a, ops::mul(tp.rt(), g, b.value));
    if (b.node >= 0) tp.accumulate(b, ops::mul(tp.rt(), g, a.value));
  });
}

Var scale(Tape& t, const Var& x, float s) {
  return t.record(ops::scale(t.rt(), x.value, s), {&x},
                  [xn = x.node, s](Tape& tp, const Tensor& g) {
                    tp.accumulate(xn, ops::scale(tp.rt(), g, s));
                  });
}

Var gelu(Tape& t, const Var& x) {
  return t.record(ops::gelu(t.rt(), x.value), {&x}, [x](Tape& tp, const Tensor& g) {
    tp.accumulate(x, ops::gelu_backward(tp.rt(), x.value, g));
  });
}

Var relu(Tape& t, const Var& x) {
  return t.record(ops::relu(t.rt(), x.value), {&x}, [x](Tape& tp, const Tensor& g) {
    tp.accumulate(x, ops::relu_backward(tp.rt(), x.value, g));
  });
}

Var sigmoid(Tape& t, const Var& x) {
  Tensor y = ops::sigmoid(t.rt(), x.value);
  return t.record(y, {&x}, [xn = x.node, y](Tape& tp, const Tensor& g) {
    tp.accumulate(xn, ops::sigmoid_backward(tp.rt(), y, g));
  });
}

Var tanh(Tape& t, const Var& x) {
  Tensor y = ops::tanh(t.rt(), x.value);
  return t.record(y, {&x}, [xn = x.node, y](Tape& tp, const Tensor& g) {
    tp.accumulate(xn, ops::tanh_backward(tp.rt(), y, g));
  });
}

Var layernorm(Tape& t, const Var& x, const Var& w, const Var& b) {
  ops::LayerNormOut o = ops::layernorm(t.rt(), x.value, w.value, b.value);
  return t.record(o.y, {&x, &w, &b},
                  [x, w, bn = b.node, mean = o.mean, rstd = o.rstd](Tape& tp, const Tensor& g) {
                    ops::LayerNormGrads d =
                        ops::layernorm_backward(tp.rt(), g, x.value, w.value, mean, rstd);
                    tp.accumulate(x, d.dx);
                    tp.accumulate(w, d.dw);
                    tp.accumulate(bn, d.db);
                  });
}

Var attention(Tape& t, const Var& qkv, std::int64_t heads) {
  ops::AttentionOut o = ops::attention(t.rt(), qkv.value, heads);
  return t.record(o.out, {&qkv}, [qkv, att = o.att, heads](Tape& tp, const Tensor& g) {
    tp.accumulate(qkv, ops::attention_backward(tp.rt(), g, qkv.value, att, heads));
  });
}

Var embedding(Tape& t, const Tensor& idx, const Var& wte, const Var& wpe) {
  Tensor y = ops::embedding(t.rt(), idx, wte.value, wpe.value);
  return t.record(std::move(y), {&wte, &wpe}, [idx, wte, wpe](Tape& tp, const Tensor& g) {
    const TensorSpec wpe_spec = wpe.value.defined() ? wpe.spec() : TensorSpec{};
    ops::EmbeddingGrads d = ops::embedding_backward(tp.rt(), g, idx, wte.spec(),
                                                    wpe.value.defined() ? &wpe_spec : nullptr);
    tp.accumulate(wte, d.dwte);
    if (d.dwpe.defined()) tp.accumulate(wpe, d.dwpe);
  });
}

Var dropout(Tape& t, const Var& x, float p) {
  if (p <= 0.0f) return x;
  ops::DropoutOut o = ops::dropout(t.rt(), x.value, p);
  return t.record(o.y, {&x}, [xn = x.node, mask = o.mask, p](Tape& tp, const Tensor& g) {
    tp.accumulate(xn, ops::dropout_backward(tp.rt(), g, mask, p));
  });
}

Var conv2d(Tape& t, const Var& x, const Var& w, const Var& b, std::int64_t stride,
           std::int64_t pad) {
  Tensor y = ops::conv2d(t.rt(), x.value, w.value, b.value, stride, pad);
  return t.record(std::move(y), {&x, &w, &b}, [x, w, b, stride, pad](Tape& tp, const Tensor& g) {
    ops::Conv2dGrads d = ops::conv2d_backward(tp.rt(), g, x.value, w.value, b.value.defined(),
                                              x.node >= 0, stride, pad);
    tp.accumulate(w, d.dw);
    if (d.db.defined()) tp.accumulate(b, d.db);
    if (d.dx.defined()) tp.accumulate(x, d.dx);
  });
}

BatchNormResult batchnorm(Tape& t, const Var& x, const Var& gamma, const Var& beta) {
  ops::BatchNormOut o = ops::batchnorm(t.rt(), x.value, gamma.value, beta.value);
  Var y =
      t.record(o.y, {&x, &gamma, &beta},
               [x, gamma, bn = beta.node, mean = o.mean, rstd = o.rstd](Tape& tp, const Tensor& g) {
                 ops::BatchNormGrads d =
                     ops::batchnorm_backward(tp.rt(), g, x.value, gamma.value, mean, rstd);
                 tp.accumulate(x, d.dx);
                 tp.accumulate(gamma, d.dgamma);
                 tp.accumulate(bn, d.dbeta);
               });
  return {std::move(y), o.mean, o.rstd};
}

Var maxpool2d(Tape& t, const Var& x, std::int64_t k, std::int64_t s) {
  ops::MaxPoolOut o = ops::maxpool2d(t.rt(), x.value, k, s);
  return t.record(o.y, {&x},
                  [xn = x.node, spec = x.spec(), arg = o.argmax, k, s](Tape& tp, const Tensor& g) {
                    tp.accumulate(xn, ops::maxpool2d_backward(tp.rt(), g, arg, spec, k, s));
                  });
}

Var avgpool(Tape& t, const Var& x) {
  return t.record(ops::avgpool(t.rt(), x.value), {&x},
                  [xn = x.node, spec = x.spec()](Tape& tp, const Tensor& g) {
                    tp.accumulate(xn, ops::avgpool_backward(tp.rt(), g, spec));
                  });
}

Var reshape(Tape& t, const Var& x, std::vector<std::int64_t> shape) {
  return t.record(ops::reshape(t.rt(), x.value, std::move(shape)), {&x},
                  [xn = x.node, s = x.spec().shape](Tape& tp, const Tensor& g) {
                    tp.accumulate(xn, ops::reshape(tp.rt(), g, s));
                  });
}

// The gradient of a slice is the slice's gradient with zeros around it.
Var narrow(Tape& t, const Var& x, std::int64_t offset, std::vector<std::int64_t> shape) {
  Tensor y = ops::narrow(t.rt(), x.value, offset, std::move(shape));
  return t.record(std::move(y), {&x},
                  [xn = x.node, xs = x.spec(), offset](Tape& tp, const Tensor& g) {
                    Runtime& r = tp.rt();
                    const std::int64_t n = g.spec().numel(), total = xs.numel();
                    std::vector<Tensor> parts;
                    if (offset > 0)
                      parts.push_back(ops::zeros(r, TensorSpec{{offset}, DType::kF32}));
                    parts.push_back(ops::reshape(r, g, {n}));
                    if (offset + n < total)
                      parts.push_back(ops::zeros(r, TensorSpec{{total - offset - n}, DType::kF32}));
                    tp.accumulate(xn, ops::reshape(r, ops::concat(r, parts), xs.shape));
                  });
}

Var concat(Tape& t, const std::vector<Var>& parts) {
  std::vector<Tensor> values;
  std::vector<std::pair<int, TensorSpec>> info;
  for (const Var& p : parts) {
    values.push_back(p.value);
    info.emplace_back(p.node, p.spec());
  }
  return t.record(ops::concat(t.rt(), values), parts, [info](Tape& tp, const Tensor& g) {
    std::int64_t offset = 0;
    for (const auto& [node, spec] : info) {
      if (node >= 0) tp.accumulate(node, ops::narrow(tp.rt(), g, offset, spec.shape));
      offset += spec.numel();
    }
  });
}

Var cross_entropy_mean(Tape& t, const Var& logits, const Tensor& targets) {
  Runtime& rt = t.rt();
  const std::int64_t n = targets.spec().numel();
  Tensor loss = ops::scale(rt, ops::sum(rt, ops::cross_entropy(rt, logits.value, targets)),
                           1.0f / static_cast<float>(n));
  return t.record(std::move(loss), {&logits}, [logits, targets, n](Tape& tp, const Tensor& g) {
    tp.accumulate(logits, ops::cross_entropy_backward(tp.rt(), logits.value, targets, g,
                                                      1.0f / static_cast<float>(n)));
  });
}

}  // namespace remat::ad
