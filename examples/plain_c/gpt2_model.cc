#include "examples/plain_c/gpt2_model.h"

#include <cmath>
#include <numeric>
#include <string_view>

#include "examples/plain_c/gpt2_kernels.h"
#include "examples/plain_c/gpt2_ops.h"
#include "examples/plain_c/kernels.h"
#include "remat/runtime.h"

namespace plain_c {
namespace {

using remat::Tensor;
using remat::TensorSpec;
using Floats = std::vector<float>;

// Where each parameter is in the list gpt2_parameter_shapes gives: the two embeddings, then
// kPerLayer per layer in LayerParam order, then the final layernorm and the head.
enum LayerParam : std::size_t {
  kLn1W,
  kLn1B,
  kQkvW,
  kQkvB,
  kAttProjW,
  kAttProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kPerLayer
};
enum FinalParam : std::size_t { kLnfW, kLnfB, kHeadW, kHeadB };
constexpr std::size_t kWte = 0, kWpe = 1;

std::size_t layer_base(int l) { return 2 + kPerLayer * static_cast<std::size_t>(l); }
std::size_t final_base(const Gpt2Config& c) { return layer_base(c.layers); }

std::size_t floats(std::int64_t a, std::int64_t b = 1) { return static_cast<std::size_t>(a * b); }

// splitmix64's finalizer over (seed, stream, index): independent streams of draws, the same
// on every run.
std::uint64_t hash(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1) + 0xD6E8FEB86659FD93ULL * i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1), from the hash's top 24 bits.
float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  return static_cast<float>(hash(seed, stream, i) >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

enum class Init { kOnes, kZeros, kWeight, kResidualWeight };

struct ParamDef {
  std::vector<std::int64_t> shape;
  Init init;
};

std::vector<ParamDef> parameter_defs(const Gpt2Config& c) {
  const std::int64_t C = c.channels;
  std::vector<ParamDef> defs = {{{c.vocab, C}, Init::kWeight}, {{c.seq, C}, Init::kWeight}};
  for (int l = 0; l < c.layers; ++l) {
    const std::vector<ParamDef> layer = {
        {{C}, Init::kOnes},                   // ln1 weight
        {{C}, Init::kZeros},                  // ln1 bias
        {{3 * C, C}, Init::kWeight},          // qkv weight
        {{3 * C}, Init::kZeros},              // qkv bias
        {{C, C}, Init::kResidualWeight},      // attention projection weight
        {{C}, Init::kZeros},                  // attention projection bias
        {{C}, Init::kOnes},                   // ln2 weight
        {{C}, Init::kZeros},                  // ln2 bias
        {{4 * C, C}, Init::kWeight},          // fc weight
        {{4 * C}, Init::kZeros},              // fc bias
        {{C, 4 * C}, Init::kResidualWeight},  // fc projection weight
        {{C}, Init::kZeros}};                 // fc projection bias
    defs.insert(defs.end(), layer.begin(), layer.end());
  }
  const std::vector<ParamDef> final = {{{C}, Init::kOnes},
                                       {{C}, Init::kZeros},
                                       {{c.vocab, C}, Init::kWeight},
                                       {{c.vocab}, Init::kZeros}};
  defs.insert(defs.end(), final.begin(), final.end());
  return defs;
}

// Made-up text whose bytes are the token stream: repetitive enough that the loss falls
// within a few steps, varied enough that it does not fall to zero.
constexpr std::string_view kText =
    "every buffer of the loop is a tensor now; the runtime keeps what fits under the budget "
    "and computes the rest again when a kernel reads it. the weights stay, the moments wait "
    "on the host, and the activations come and go. same kernels, same order, same bits. ";

}  // namespace

std::string gpt2_config_error(const Gpt2Config& c) {
  if (c.batch < 1 || c.seq < 1 || c.layers < 1 || c.channels < 1 || c.heads < 1 || c.vocab < 2)
    return "batch, seq, layers, channels and heads must be at least 1, vocab at least 2";
  if (c.channels % c.heads != 0) return "channels must be a multiple of heads";
  return "";
}

std::vector<std::vector<std::int64_t>> gpt2_parameter_shapes(const Gpt2Config& c) {
  std::vector<std::vector<std::int64_t>> shapes;
  for (ParamDef& d : parameter_defs(c)) shapes.push_back(std::move(d.shape));
  return shapes;
}

std::size_t gpt2_parameter_count(const Gpt2Config& c) {
  std::size_t n = 0;
  for (const ParamDef& d : parameter_defs(c))
    n += floats(std::accumulate(d.shape.begin(), d.shape.end(), std::int64_t{1},
                                [](std::int64_t a, std::int64_t b) { return a * b; }));
  return n;
}

std::vector<std::vector<float>> gpt2_initial_parameters(const Gpt2Config& c) {
  // Uniform on [-a, a] has standard deviation a / sqrt(3).
  const float weight = 0.02f * std::sqrt(3.0f);
  const float residual = weight / std::sqrt(2.0f * static_cast<float>(c.layers));
  std::vector<std::vector<float>> params;
  for (const ParamDef& d : parameter_defs(c)) {
    std::size_t n = 1;
    for (std::int64_t k : d.shape) n *= floats(k);
    Floats p(n, d.init == Init::kOnes ? 1.0f : 0.0f);
    if (d.init == Init::kWeight || d.init == Init::kResidualWeight) {
      const float scale = d.init == Init::kWeight ? weight : residual;
      for (std::size_t i = 0; i < n; ++i) p[i] = scale * uniform(c.seed, params.size(), i);
    }
    params.push_back(std::move(p));
  }
  return params;
}

void gpt2_step_tokens(const Gpt2Config& c, int step, std::vector<std::int32_t>* inputs,
                      std::vector<std::int32_t>* targets) {
  const std::size_t T = floats(c.seq);
  inputs->resize(floats(c.batch, c.seq));
  targets->resize(inputs->size());
  // Streams past the parameters' (one per parameter) so that data and weights never share.
  const std::uint64_t stream = (1ULL << 32) + static_cast<std::uint64_t>(step);
  for (int b = 0; b < c.batch; ++b) {
    const std::size_t start = hash(c.seed, stream, static_cast<std::uint64_t>(b)) % kText.size();
    auto token = [&](std::size_t i) {
      return static_cast<std::int32_t>(
          static_cast<unsigned char>(kText[(start + i) % kText.size()]) %
          static_cast<unsigned>(c.vocab));
    };
    for (std::size_t t = 0; t < T; ++t) {
      (*inputs)[floats(b) * T + t] = token(t);
      (*targets)[floats(b) * T + t] = token(t + 1);
    }
  }
}

// ---------------------------------------------------------------------------------------
// The reference loop

// What one layer's backward reads of its forward.
struct Gpt2ReferenceLoop::Layer {
  Floats x, ln1, ln1_mean, ln1_rstd, qkv, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};

Gpt2ReferenceLoop::Gpt2ReferenceLoop(Gpt2Config config) : c_(std::move(config)) {
  params_ = gpt2_initial_parameters(c_);
  for (const Floats& p : params_) {
    grads_.emplace_back(p.size(), 0.0f);
    m_.emplace_back(p.size(), 0.0f);
    v_.emplace_back(p.size(), 0.0f);
  }
}

Floats Gpt2ReferenceLoop::layer_forward(int l, Layer& a) {
  const int B = c_.batch, T = c_.seq, C = c_.channels, BT = B * T;
  auto p = [&](LayerParam k) { return params_[layer_base(l) + k].data(); };
  a.ln1.resize(floats(BT, C));
  a.ln1_mean.resize(floats(BT));
  a.ln1_rstd.resize(floats(BT));
  layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), a.x.data(), p(kLn1W),
                    p(kLn1B), BT, C);
  a.qkv.resize(floats(BT, 3 * C));
  matmul_forward(a.qkv.data(), a.ln1.data(), p(kQkvW), p(kQkvB), BT, C, 3 * C);
  a.atty.resize(floats(BT, C));
  Floats att(attention_region_floats(B, T, c_.heads)), proj(floats(BT, C));
  attention_forward(a.atty.data(), a.qkv.data(), att.data(), B, T, C, c_.heads);
  matmul_forward(proj.data(), a.atty.data(), p(kAttProjW), p(kAttProjB), BT, C, C);
  a.res2.resize(floats(BT, C));
  add_forward(a.res2.data(), a.x.data(), proj.data(), BT * C);
  a.ln2.resize(floats(BT, C));
  a.ln2_mean.resize(floats(BT));
  a.ln2_rstd.resize(floats(BT));
  layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p(kLn2W),
                    p(kLn2B), BT, C);
  a.fch.resize(floats(BT, 4 * C));
  a.fch_gelu.resize(a.fch.size());
  matmul_forward(a.fch.data(), a.ln2.data(), p(kFcW), p(kFcB), BT, C, 4 * C);
  gelu_forward(a.fch_gelu.data(), a.fch.data(), BT * 4 * C);
  Floats out(floats(BT, C));
  matmul_forward(proj.data(), a.fch_gelu.data(), p(kFcProjW), p(kFcProjB), BT, 4 * C, C);
  add_forward(out.data(), a.res2.data(), proj.data(), BT * C);
  return out;
}

// The residual stream's gradient is summed by add_forward where its two paths meet, as the
// remat loop's add ops sum it, rather than accumulated in place as llm.c does.
Floats Gpt2ReferenceLoop::layer_backward(int l, const Layer& a, const Floats& dout) {
  const int B = c_.batch, T = c_.seq, C = c_.channels, BT = B * T;
  auto p = [&](LayerParam k) { return params_[layer_base(l) + k].data(); };
  auto g = [&](LayerParam k) { return grads_[layer_base(l) + k].data(); };
  Floats dfch_gelu(floats(BT, 4 * C)), dfch(dfch_gelu.size()), dln(floats(BT, C)),
      dres2_ln(dln.size()), dres2(dln.size()), datty(dln.size()), dqkv(floats(BT, 3 * C)),
      dx_ln(dln.size()), dx(dln.size());
  matmul_backward(dfch_gelu.data(), g(kFcProjW), g(kFcProjB), dout.data(), a.fch_gelu.data(),
                  p(kFcProjW), BT, 4 * C, C);
  gelu_backward(dfch.data(), a.fch.data(), dfch_gelu.data(), BT * 4 * C);
  matmul_backward(dln.data(), g(kFcW), g(kFcB), dfch.data(), a.ln2.data(), p(kFcW), BT, C, 4 * C);
  layernorm_backward(dres2_ln.data(), g(kLn2W), g(kLn2B), dln.data(), a.res2.data(), p(kLn2W),
                     a.ln2_mean.data(), a.ln2_rstd.data(), BT, C);
  add_forward(dres2.data(), dout.data(), dres2_ln.data(), BT * C);
  matmul_backward(datty.data(), g(kAttProjW), g(kAttProjB), dres2.data(), a.atty.data(),
                  p(kAttProjW), BT, C, C);
  Floats scratch(2 * attention_region_floats(B, T, c_.heads));
  attention_backward(dqkv.data(), datty.data(), a.qkv.data(), scratch.data(), B, T, C, c_.heads);
  matmul_backward(dln.data(), g(kQkvW), g(kQkvB), dqkv.data(), a.ln1.data(), p(kQkvW), BT, C,
                  3 * C);
  layernorm_backward(dx_ln.data(), g(kLn1W), g(kLn1B), dln.data(), a.x.data(), p(kLn1W),
                     a.ln1_mean.data(), a.ln1_rstd.data(), BT, C);
  add_forward(dx.data(), dres2.data(), dx_ln.data(), BT * C);
  return dx;
}

float Gpt2ReferenceLoop::step(int step) {
  std::vector<std::int32_t> in, tg;
  gpt2_step_tokens(c_, step, &in, &tg);
  const int B = c_.batch, T = c_.seq, C = c_.channels, V = c_.vocab, BT = B * T;
  for (Floats& g : grads_) zero(g.data(), g.size());
  Floats x(floats(BT, C));
  encoder_forward(x.data(), in.data(), params_[kWte].data(), params_[kWpe].data(), B, T, C);
  std::vector<Layer> acts(static_cast<std::size_t>(c_.layers));
  for (int l = 0; l < c_.layers; ++l) {
    acts[static_cast<std::size_t>(l)].x = std::move(x);
    x = layer_forward(l, acts[static_cast<std::size_t>(l)]);
  }
  const std::size_t f = final_base(c_);
  auto p = [&](FinalParam k) { return params_[f + k].data(); };
  auto g = [&](FinalParam k) { return grads_[f + k].data(); };
  Floats lnf(x.size()), mean(floats(BT)), rstd(floats(BT)), logits(floats(BT, V)),
      probs(logits.size()), loss(1), dlogits(logits.size()), dlnf(x.size()), dx(x.size());
  layernorm_forward(lnf.data(), mean.data(), rstd.data(), x.data(), p(kLnfW), p(kLnfB), BT, C);
  matmul_forward(logits.data(), lnf.data(), p(kHeadW), p(kHeadB), BT, C, V);
  crossentropy_forward(loss.data(), probs.data(), logits.data(), tg.data(), BT, V);
  crossentropy_backward(dlogits.data(), probs.data(), tg.data(), BT, V);
  matmul_backward(dlnf.data(), g(kHeadW), g(kHeadB), dlogits.data(), lnf.data(), p(kHeadW), BT, C,
                  V);
  layernorm_backward(dx.data(), g(kLnfW), g(kLnfB), dlnf.data(), x.data(), p(kLnfW), mean.data(),
                     rstd.data(), BT, C);
  for (int l = c_.layers - 1; l >= 0; --l) {
    dx = layer_backward(l, acts.back(), dx);
    acts.pop_back();
  }
  encoder_backward(grads_[kWte].data(), grads_[kWpe].data(), dx.data(), in.data(), B, T, C);
  for (std::size_t i = 0; i < params_.size(); ++i)
    adamw(params_[i].data(), grads_[i].data(), m_[i].data(), v_[i].data(), params_[i].size(), c_.lr,
          step + 1);
  losses_.push_back(loss[0]);
  return loss[0];
}

// ---------------------------------------------------------------------------------------
// The same loop in remat

namespace {

struct Weights : remat::TrainingProgram::State {
  std::vector<Tensor> params, grads, m, v;
  std::vector<float> losses;  // where kernels ran
};

// The tensors of Gpt2ReferenceLoop::Layer: the runtime's, so evictable.
struct LayerTensors {
  Tensor x, ln1, ln1_mean, ln1_rstd, qkv, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
};

// matmul_backward adding into the gradients of the weight at `k` and the bias after it.
Tensor matmul_backward(remat::Runtime& rt, const Weights& w, const Tensor& dout, const Tensor& inp,
                       std::size_t k) {
  const Tensor args[] = {dout, inp, w.params[k], w.grads[k], w.grads[k + 1]};
  return rt.call_accumulate(gpt2::matmul_backward_op(), args, gpt2::kMatmulAccumulated).at(0);
}

// layernorm_backward adding into the gradients of the weight at `k` and the bias after it;
// `mean` and `rstd` are what the forward op saved of `inp`.
Tensor layernorm_backward(remat::Runtime& rt, const Weights& w, const Tensor& dout,
                          const Tensor& inp, const Tensor& mean, const Tensor& rstd,
                          std::size_t k) {
  const Tensor args[] = {dout, inp, w.params[k], mean, rstd, w.grads[k], w.grads[k + 1]};
  return rt.call_accumulate(gpt2::layernorm_backward_op(), args, gpt2::kLayernormAccumulated).at(0);
}

Tensor layer_forward(remat::Runtime& rt, const Weights& w, int l, int heads, LayerTensors& a) {
  const Tensor* p = &w.params[layer_base(l)];
  std::vector<Tensor> ln1 = rt.call(gpt2::layernorm_op(), {a.x, p[kLn1W], p[kLn1B]});
  a.ln1 = ln1[0];
  a.ln1_mean = ln1[1];
  a.ln1_rstd = ln1[2];
  a.qkv = rt.call1(gpt2::matmul_op(), {a.ln1, p[kQkvW], p[kQkvB]});
  a.atty = rt.call1(gpt2::attention_op(heads), {a.qkv});
  a.res2 = rt.call1(gpt2::add_op(),
                    {a.x, rt.call1(gpt2::matmul_op(), {a.atty, p[kAttProjW], p[kAttProjB]})});
  std::vector<Tensor> ln2 = rt.call(gpt2::layernorm_op(), {a.res2, p[kLn2W], p[kLn2B]});
  a.ln2 = ln2[0];
  a.ln2_mean = ln2[1];
  a.ln2_rstd = ln2[2];
  a.fch = rt.call1(gpt2::matmul_op(), {a.ln2, p[kFcW], p[kFcB]});
  a.fch_gelu = rt.call1(gpt2::gelu_op(), {a.fch});
  return rt.call1(gpt2::add_op(),
                  {a.res2, rt.call1(gpt2::matmul_op(), {a.fch_gelu, p[kFcProjW], p[kFcProjB]})});
}

Tensor layer_backward(remat::Runtime& rt, const Weights& w, int l, int heads, const LayerTensors& a,
                      const Tensor& dout) {
  const std::size_t base = layer_base(l);
  const Tensor dfch_gelu = matmul_backward(rt, w, dout, a.fch_gelu, base + kFcProjW);
  const Tensor dfch = rt.call1(gpt2::gelu_backward_op(), {a.fch, dfch_gelu});
  const Tensor dln2 = matmul_backward(rt, w, dfch, a.ln2, base + kFcW);
  const Tensor dres2 = rt.call1(
      gpt2::add_op(),
      {dout, layernorm_backward(rt, w, dln2, a.res2, a.ln2_mean, a.ln2_rstd, base + kLn2W)});
  const Tensor datty = matmul_backward(rt, w, dres2, a.atty, base + kAttProjW);
  const Tensor dqkv = rt.call1(gpt2::attention_backward_op(heads), {datty, a.qkv});
  const Tensor dln1 = matmul_backward(rt, w, dqkv, a.ln1, base + kQkvW);
  return rt.call1(gpt2::add_op(), {dres2, layernorm_backward(rt, w, dln1, a.x, a.ln1_mean,
                                                             a.ln1_rstd, base + kLn1W)});
}

// Moves AdamW's moments of parameter i to the host tier; their next update brings them back
// (Note [The host tier] in runtime/core/host_tier.cc). Refused, they stay: a runtime without
// host memory (RuntimeOptions::host_memory_bytes) trains the same, only with less room.
void offload_moments(remat::Runtime& rt, const Weights& w, std::size_t i) {
  rt.offload(w.m[i]);
  rt.offload(w.v[i]);
}

}  // namespace

std::unique_ptr<remat::TrainingProgram::State> Gpt2RematLoop::make_state(remat::Runtime& rt) {
  const bool runs = rt.options().backend != remat::Backend::kSimulated;
  auto w = std::make_unique<Weights>();
  const std::vector<std::vector<std::int64_t>> shapes = gpt2_parameter_shapes(c_);
  const std::vector<Floats> init = gpt2_initial_parameters(c_);
  for (std::size_t i = 0; i < init.size(); ++i) {
    const TensorSpec spec{shapes[i]};
    const Floats zeros(init[i].size(), 0.0f);
    w->params.push_back(rt.constant(spec, runs ? init[i].data() : nullptr));
    w->grads.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
    w->m.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
    w->v.push_back(rt.constant(spec, runs ? zeros.data() : nullptr));
    if (c_.moments_on_host) offload_moments(rt, *w, i);
  }
  return w;
}

// One step, as Gpt2ReferenceLoop::step makes it, every kernel through the runtime. The
// activations are locals: they go when the step returns, each layer's as its backward ends.
void Gpt2RematLoop::run_step(remat::Runtime& rt, State& state, int step) {
  auto& w = static_cast<Weights&>(state);
  const bool runs = rt.options().backend != remat::Backend::kSimulated;
  std::vector<std::int32_t> in, tg;
  gpt2_step_tokens(c_, step, &in, &tg);
  std::vector<int> all(w.grads.size());
  std::iota(all.begin(), all.end(), 0);
  rt.update(gpt2::zero_op(), w.grads, all);
  const TensorSpec token_spec{{c_.batch, c_.seq}, remat::DType::kI32};
  const Tensor tokens = rt.constant(token_spec, runs ? in.data() : nullptr);
  const Tensor targets = rt.constant(token_spec, runs ? tg.data() : nullptr);
  Tensor x = rt.call1(gpt2::encoder_op(), {tokens, w.params[kWte], w.params[kWpe]});
  std::vector<LayerTensors> acts(static_cast<std::size_t>(c_.layers));
  for (int l = 0; l < c_.layers; ++l) {
    acts[static_cast<std::size_t>(l)].x = x;
    x = layer_forward(rt, w, l, c_.heads, acts[static_cast<std::size_t>(l)]);
  }
  const std::size_t f = final_base(c_);
  std::vector<Tensor> lnf =
      rt.call(gpt2::layernorm_op(), {x, w.params[f + kLnfW], w.params[f + kLnfB]});
  std::vector<Tensor> ce = rt.call(
      gpt2::crossentropy_op(),
      {rt.call1(gpt2::matmul_op(), {lnf[0], w.params[f + kHeadW], w.params[f + kHeadB]}), targets});
  // Read now, while it is resident: read later it might have been evicted, and a 4-byte
  // loss recomputed from its lineage would mean the whole forward pass again.
  float loss = NAN;
  if (remat::read_back(rt, ce[0], &loss)) w.losses.push_back(loss);
  rt.mark_backward();
  Tensor dx = rt.call1(gpt2::crossentropy_backward_op(), {ce[1], targets});
  ce.clear();
  dx = matmul_backward(rt, w, dx, lnf[0], f + kHeadW);
  dx = layernorm_backward(rt, w, dx, x, lnf[1], lnf[2], f + kLnfW);
  lnf.clear();
  x.reset();
  for (int l = c_.layers - 1; l >= 0; --l) {
    dx = layer_backward(rt, w, l, c_.heads, acts.back(), dx);
    acts.pop_back();  // this layer's activations are no longer needed
  }
  rt.update(gpt2::encoder_backward_op(), {w.grads[kWte], w.grads[kWpe], dx, tokens}, {0, 1});
  for (std::size_t i = 0; i < w.params.size(); ++i) {
    rt.update(gpt2::adamw_op(c_.lr, step + 1), {w.params[i], w.grads[i], w.m[i], w.v[i]},
              {0, 2, 3});
    if (c_.moments_on_host) offload_moments(rt, w, i);
  }
}

remat::PlanCache::Key Gpt2RematLoop::shape_key(int /*step*/) const { return {c_.batch, c_.seq}; }

const std::vector<float>& Gpt2RematLoop::losses(const State& state) {
  return static_cast<const Weights&>(state).losses;
}

std::vector<std::vector<float>> Gpt2RematLoop::parameters(remat::Runtime& rt, const State& state) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : static_cast<const Weights&>(state).params) {
    out.emplace_back(static_cast<std::size_t>(p.spec().numel()));
    rt.read(p, out.back().data());
  }
  return out;
}

std::size_t Gpt2RematLoop::offloaded_moments(const remat::Runtime& rt, const State& state) {
  const auto& w = static_cast<const Weights&>(state);
  std::size_t n = 0;
  for (std::size_t i = 0; i < w.m.size(); ++i)
    n += static_cast<std::size_t>(rt.offloaded(w.m[i])) +
         static_cast<std::size_t>(rt.offloaded(w.v[i]));
  return n;
}

}  // namespace plain_c
