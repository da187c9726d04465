#include "examples/plain_c/model.h"

#include <cmath>

#include "examples/plain_c/kernels.h"
#include "remat/op.h"
#include "remat/runtime.h"

namespace plain_c {
namespace {

using remat::KernelContext;
using remat::OpPtr;
using remat::OpWork;
using remat::Outputs;
using remat::SpecList;
using remat::Tensor;
using remat::TensorSpec;

int dim(const TensorSpec& s, std::size_t i) { return static_cast<int>(s.shape[i]); }

// A deterministic uniform draw in [-1, 1) from (seed, stream, index).
float draw(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + stream * 0xD1B54A32D192ED03ULL + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

// ---------------------------------------------------------------------------------------
// The kernels as remat ops: a shape function, the kernel on the KernelContext's pointers,
// and the work the roofline prices it by.

// (B, C) x (OC, C)^T + (OC) -> (B, OC)
OpPtr matmul_forward_op() {
  return remat::make_op_with_work(
      "matmul_forward",
      [](SpecList in) {
        return Outputs{{TensorSpec{{in[0].shape[0], in[1].shape[0]}}}};
      },
      [](const KernelContext& k) {
        matmul_forward(k.output<float>(0), k.input<float>(0), k.input<float>(1), k.input<float>(2),
                       dim(k.input_spec(0), 0), dim(k.input_spec(0), 1), dim(k.input_spec(1), 0));
      },
      [](SpecList in) {
        const double b = in[0].shape[0], c = in[0].shape[1], oc = in[1].shape[0];
        return OpWork{.flops = 2 * b * c * oc, .bytes = 4 * (b * c + oc * c + b * oc)};
      });
}

// Inputs dout (B, OC), inp (B, C), weight (OC, C), dweight, dbias: output dinp (B, C); the
// kernel's outputs 1 and 2 are what it adds into (Runtime::call_accumulate).
OpPtr matmul_backward_op() {
  return remat::make_op_with_work(
      "matmul_backward", [](SpecList in) { return Outputs{{in[1]}}; },
      [](const KernelContext& k) {
        matmul_backward(k.output<float>(0), k.output<float>(1), k.output<float>(2),
                        k.input<float>(0), k.input<float>(1), k.input<float>(2),
                        dim(k.input_spec(1), 0), dim(k.input_spec(1), 1), dim(k.input_spec(2), 0));
      },
      [](SpecList in) {
        const double b = in[1].shape[0], c = in[1].shape[1], oc = in[2].shape[0];
        return OpWork{.flops = 4 * b * c * oc, .bytes = 8 * (b * c + oc * c + b * oc)};
      });
}

OpPtr elementwise_op(const char* name, int inputs, void (*kernel)(const KernelContext&, int n)) {
  return remat::make_op_with_work(
      name, [](SpecList in) { return Outputs{{in[0]}}; },
      [kernel](const KernelContext& k) { kernel(k, static_cast<int>(k.input_spec(0).numel())); },
      [inputs](SpecList in) {
        const double n = static_cast<double>(in[0].numel());
        return OpWork{.flops = 8 * n, .bytes = 4 * n * (inputs + 1)};
      });
}

OpPtr gelu_forward_op() {
  return elementwise_op("gelu_forward", 1, [](const KernelContext& k, int n) {
    gelu_forward(k.output<float>(0), k.input<float>(0), n);
  });
}
OpPtr gelu_backward_op() {  // inputs: the forward's input, dout
  return elementwise_op("gelu_backward", 2, [](const KernelContext& k, int n) {
    gelu_backward(k.output<float>(0), k.input<float>(0), k.input<float>(1), n);
  });
}
OpPtr add_op() {
  return elementwise_op("add", 2, [](const KernelContext& k, int n) {
    add_forward(k.output<float>(0), k.input<float>(0), k.input<float>(1), n);
  });
}

// Inputs logits (B, V), targets (B) int32: outputs the mean loss (1) and probs (B, V).
OpPtr crossentropy_forward_op() {
  return remat::make_op_with_work(
      "crossentropy_forward",
      [](SpecList in) {
        return Outputs{{TensorSpec{{1}}}, {in[0]}};
      },
      [](const KernelContext& k) {
        crossentropy_forward(k.output<float>(0), k.output<float>(1), k.input<float>(0),
                             k.input<std::int32_t>(1), dim(k.input_spec(0), 0),
                             dim(k.input_spec(0), 1));
      },
      [](SpecList in) {
        const double n = static_cast<double>(in[0].numel());
        return OpWork{.flops = 20 * n, .bytes = 8 * n};
      });
}
OpPtr crossentropy_backward_op() {  // inputs: probs, targets
  return remat::make_op_with_work(
      "crossentropy_backward", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        crossentropy_backward(k.output<float>(0), k.input<float>(0), k.input<std::int32_t>(1),
                              dim(k.input_spec(0), 0), dim(k.input_spec(0), 1));
      },
      [](SpecList in) {
        const double n = static_cast<double>(in[0].numel());
        return OpWork{.flops = 2 * n, .bytes = 8 * n};
      });
}

// Runtime::update ops: their outputs are the constants they write.
OpPtr zero_op() {
  return remat::make_op(
      "zero", [](SpecList) { return Outputs{}; },
      [](const KernelContext& k) {
        for (std::size_t i = 0; i < k.outputs.size(); ++i)
          zero(k.output<float>(i), static_cast<std::size_t>(k.output_spec(i).numel()));
      });
}
OpPtr adamw_op(float lr, int t) {  // args param, grad, m, v; writes param, m, v
  return remat::make_op(
      "adamw", [](SpecList) { return Outputs{}; },
      [lr, t](const KernelContext& k) {
        adamw(k.output<float>(0), k.input<float>(1), k.output<float>(1), k.output<float>(2),
              static_cast<std::size_t>(k.input_spec(0).numel()), lr, t);
      });
}

struct Weights : remat::TrainingProgram::State {
  std::vector<Tensor> params, grads, m, v;
  std::vector<float> losses;  // where kernels ran
};

}  // namespace

std::vector<std::vector<std::int64_t>> parameter_shapes(const Config& c) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (int l = 0; l < c.blocks; ++l) {
    shapes.push_back({c.hidden, c.channels});
    shapes.push_back({c.hidden});
    shapes.push_back({c.channels, c.hidden});
    shapes.push_back({c.channels});
  }
  shapes.push_back({c.classes, c.channels});
  shapes.push_back({c.classes});
  return shapes;
}

std::vector<std::vector<float>> initial_parameters(const Config& c) {
  std::vector<std::vector<float>> params;
  for (const auto& shape : parameter_shapes(c)) {
    std::size_t n = 1;
    for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
    const float scale = shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(shape[1])) : 0;
    std::vector<float> p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = scale * draw(c.seed, params.size(), i);
    params.push_back(std::move(p));
  }
  return params;
}

void step_inputs(const Config& c, int step, std::vector<float>* x, std::vector<std::int32_t>* y) {
  const int rows = c.batches[static_cast<std::size_t>(step) % c.batches.size()];
  x->resize(static_cast<std::size_t>(rows) * c.channels);
  y->resize(static_cast<std::size_t>(rows));
  const std::uint64_t stream = 1000 + static_cast<std::uint64_t>(step);
  for (std::size_t i = 0; i < x->size(); ++i) (*x)[i] = draw(c.seed, stream, i);
  for (int r = 0; r < rows; ++r) {
    const float s = (*x)[static_cast<std::size_t>(r) * c.channels];
    (*y)[static_cast<std::size_t>(r)] =
        static_cast<std::int32_t>((s + 1.0f) * 0.5f * static_cast<float>(c.classes)) % c.classes;
  }
}

// ---------------------------------------------------------------------------------------
// The reference loop

ReferenceLoop::ReferenceLoop(Config config) : c_(std::move(config)) {
  params_ = initial_parameters(c_);
  for (const auto& p : params_) {
    grads_.emplace_back(p.size(), 0.0f);
    m_.emplace_back(p.size(), 0.0f);
    v_.emplace_back(p.size(), 0.0f);
  }
}

float ReferenceLoop::step(int step) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  step_inputs(c_, step, &x, &y);
  const int B = static_cast<int>(y.size()), C = c_.channels, H = c_.hidden, V = c_.classes;
  for (auto& g : grads_) zero(g.data(), g.size());
  std::vector<std::vector<float>> hs{x}, as, gs;
  for (int l = 0; l < c_.blocks; ++l) {
    const auto* p = &params_[static_cast<std::size_t>(4 * l)];
    std::vector<float> a(static_cast<std::size_t>(B) * H), g(a.size()), o(x.size()), h(x.size());
    matmul_forward(a.data(), hs.back().data(), p[0].data(), p[1].data(), B, C, H);
    gelu_forward(g.data(), a.data(), B * H);
    matmul_forward(o.data(), g.data(), p[2].data(), p[3].data(), B, H, C);
    add_forward(h.data(), hs.back().data(), o.data(), B * C);
    as.push_back(std::move(a));
    gs.push_back(std::move(g));
    hs.push_back(std::move(h));
  }
  const std::size_t k = params_.size() - 2;
  std::vector<float> logits(static_cast<std::size_t>(B) * V), probs(logits.size()), loss(1);
  matmul_forward(logits.data(), hs.back().data(), params_[k].data(), params_[k + 1].data(), B, C,
                 V);
  crossentropy_forward(loss.data(), probs.data(), logits.data(), y.data(), B, V);
  std::vector<float> dlogits(logits.size()), dh(x.size()), dg(gs[0].size()), da(dg.size()),
      dhb(x.size()), sum(x.size());
  crossentropy_backward(dlogits.data(), probs.data(), y.data(), B, V);
  matmul_backward(dh.data(), grads_[k].data(), grads_[k + 1].data(), dlogits.data(),
                  hs.back().data(), params_[k].data(), B, C, V);
  for (int l = c_.blocks - 1; l >= 0; --l) {
    const std::size_t q = static_cast<std::size_t>(4 * l);
    const auto L = static_cast<std::size_t>(l);
    matmul_backward(dg.data(), grads_[q + 2].data(), grads_[q + 3].data(), dh.data(), gs[L].data(),
                    params_[q + 2].data(), B, H, C);
    gelu_backward(da.data(), as[L].data(), dg.data(), B * H);
    matmul_backward(dhb.data(), grads_[q].data(), grads_[q + 1].data(), da.data(), hs[L].data(),
                    params_[q].data(), B, C, H);
    add_forward(sum.data(), dh.data(), dhb.data(), B * C);
    dh.swap(sum);
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    adamw(params_[i].data(), grads_[i].data(), m_[i].data(), v_[i].data(), params_[i].size(), c_.lr,
          step + 1);
  losses_.push_back(loss[0]);
  return loss[0];
}

// ---------------------------------------------------------------------------------------
// The same loop in remat

std::unique_ptr<remat::TrainingProgram::State> RematLoop::make_state(remat::Runtime& rt) {
  const bool runs = rt.options().backend != remat::Backend::kSimulated;
  auto w = std::make_unique<Weights>();
  const std::vector<std::vector<std::int64_t>> shapes = parameter_shapes(c_);
  const std::vector<std::vector<float>> init = initial_parameters(c_);
  for (std::size_t i = 0; i < init.size(); ++i) {
    const std::vector<float>& p = init[i];
    const TensorSpec spec{shapes[i]};
    const std::vector<float> zeros(p.size(), 0.0f);
    w->params.push_back(rt.constant(spec, runs ? p.data() : nullptr));
    w->grads.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
    w->m.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
    w->v.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
  }
  return w;
}

// One step, as ReferenceLoop::step makes it: every kernel through the runtime, the gradients
// zeroed and AdamW applied by updates, matmul_backward adding into the gradients through
// call_accumulate. The activations are locals: they go when the step returns.
void RematLoop::run_step(remat::Runtime& rt, State& state, int step) {
  auto& w = static_cast<Weights&>(state);
  const bool runs = rt.options().backend != remat::Backend::kSimulated;
  std::vector<float> xs;
  std::vector<std::int32_t> ys;
  step_inputs(c_, step, &xs, &ys);
  const std::int64_t B = static_cast<std::int64_t>(ys.size());
  std::vector<int> all(w.grads.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  rt.update(zero_op(), w.grads, all);
  const Tensor y = rt.constant({{B}, remat::DType::kI32}, runs ? ys.data() : nullptr);
  std::vector<Tensor> hs{rt.constant({{B, c_.channels}}, runs ? xs.data() : nullptr)}, as, gs;
  for (int l = 0; l < c_.blocks; ++l) {
    const Tensor* p = &w.params[static_cast<std::size_t>(4 * l)];
    as.push_back(rt.call1(matmul_forward_op(), {hs.back(), p[0], p[1]}));
    gs.push_back(rt.call1(gelu_forward_op(), {as.back()}));
    const Tensor o = rt.call1(matmul_forward_op(), {gs.back(), p[2], p[3]});
    hs.push_back(rt.call1(add_op(), {hs.back(), o}));
  }
  const std::size_t k = w.params.size() - 2;
  std::vector<Tensor> ce =
      rt.call(crossentropy_forward_op(),
              {rt.call1(matmul_forward_op(), {hs.back(), w.params[k], w.params[k + 1]}), y});
  rt.mark_backward();
  const int accumulated[] = {3, 4};  // dweight, dbias
  auto backward = [&](const Tensor& dout, const Tensor& inp, std::size_t param) {
    const Tensor args[] = {dout, inp, w.params[param], w.grads[param], w.grads[param + 1]};
    return rt.call_accumulate(matmul_backward_op(), args, accumulated).at(0);
  };
  Tensor dh = backward(rt.call1(crossentropy_backward_op(), {ce[1], y}), hs.back(), k);
  for (int l = c_.blocks - 1; l >= 0; --l) {
    const auto L = static_cast<std::size_t>(l);
    const Tensor dg = backward(dh, gs[L], 4 * L + 2);
    const Tensor da = rt.call1(gelu_backward_op(), {as[L], dg});
    dh = rt.call1(add_op(), {dh, backward(da, hs[L], 4 * L)});
    hs.pop_back();  // this block's activations are no longer needed
    as.pop_back();
    gs.pop_back();
  }
  float loss = NAN;
  if (remat::read_back(rt, ce[0], &loss)) w.losses.push_back(loss);
  for (std::size_t i = 0; i < w.params.size(); ++i)
    rt.update(adamw_op(c_.lr, step + 1), {w.params[i], w.grads[i], w.m[i], w.v[i]}, {0, 2, 3});
}

remat::PlanCache::Key RematLoop::shape_key(int step) const {
  return {c_.batches[static_cast<std::size_t>(step) % c_.batches.size()]};
}

const std::vector<float>& RematLoop::losses(const State& state) {
  return static_cast<const Weights&>(state).losses;
}

std::vector<std::vector<float>> RematLoop::parameters(remat::Runtime& rt, const State& state) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : static_cast<const Weights&>(state).params) {
    out.emplace_back(static_cast<std::size_t>(p.spec().numel()));
    rt.read(p, out.back().data());
  }
  return out;
}

}  // namespace plain_c
