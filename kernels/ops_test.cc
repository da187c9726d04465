// What the ops of kernels/ops.h declare: every op that declares its work (OpDef::work) has a
// `cost` equal to that work's price on Roofline::cpu() (max(flops / 20, bytes / 10) + 1 ns),
// and its flops and bytes are, bit for bit, those of a reference formula written out below
// per op, independently of the op's own code. The ops run on small shapes through a CPU
// runtime; set_op_observer shows each op and its input specs as it is called.
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace remat::ops {
namespace {

using i64 = std::int64_t;

// An op's work by its reference formula, and its price on the CPU roofline: a 2-core CPU's
// 20 flops and 10 bytes per ns, plus 1 ns.
struct ReferenceWork {
  double flops, bytes;
  double ns() const { return std::max(flops / 20.0, bytes / 10.0) + 1.0; }
};
ReferenceWork reference(double flops, double bytes) { return {flops, bytes}; }

i64 last(const TensorSpec& s) { return s.shape.empty() ? 1 : s.shape.back(); }
i64 rows(const TensorSpec& s) { return last(s) == 0 ? 0 : s.numel() / last(s); }
double fbytes(SpecList in) {
  double b = 0;
  for (const TensorSpec& s : in) b += static_cast<double>(s.bytes());
  return b;
}

// The attributes the test calls the ops with, where the specs do not tell them.
constexpr i64 kStride = 2, kPad = 1;   // conv2d
constexpr i64 kPoolK = 2, kPoolS = 2;  // maxpool2d

ReferenceWork gemm_work(SpecList in, bool ta, bool tb) {
  const i64 ar = rows(in[0]), ac = last(in[0]), br = rows(in[1]), bc = last(in[1]);
  const i64 m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  return reference(2.0 * m * n * k, fbytes(in) + 4.0 * m * n);
}
ReferenceWork elementwise_work(SpecList in, const Outputs&) {
  return reference(static_cast<double>(in[0].numel()), fbytes(in) + in[0].bytes());
}
double conv_flops_and_out(SpecList in, int x, int w, double* out_elems) {
  const auto& xs = in[static_cast<std::size_t>(x)].shape;
  const auto& ws = in[static_cast<std::size_t>(w)].shape;
  const i64 n = xs[0], ic = xs[1], h = xs[2], wd = xs[3], oc = ws[0], kh = ws[2], kw = ws[3];
  const i64 oh = (h + 2 * kPad - kh) / kStride + 1, ow = (wd + 2 * kPad - kw) / kStride + 1;
  *out_elems = 4.0 * n * oc * oh * ow;
  return 2.0 * n * oc * oh * ow * ic * kh * kw;
}

// Each op's reference work, by op name, from its input and output specs.
using Formula = std::function<ReferenceWork(SpecList, const Outputs&)>;
std::map<std::string, Formula> reference_formulas() {
  std::map<std::string, Formula> m;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      m[std::string("matmul") + (ta ? "_ta" : "") + (tb ? "_tb" : "")] =
          [ta, tb](SpecList in, const Outputs&) { return gemm_work(in, ta, tb); };
    }
  }
  m["linear"] = [](SpecList in, const Outputs&) { return gemm_work(in, false, true); };
  for (const char* name : {"bias_add", "bias_grad", "add", "mul", "scale", "sum", "gelu",
                           "gelu_backward", "relu", "relu_backward", "sigmoid", "sigmoid_backward",
                           "tanh", "tanh_backward", "softmax", "softmax_backward", "avgpool"}) {
    m[name] = elementwise_work;
  }
  m["zeros"] = [](SpecList, const Outputs& out) {
    return reference(0, static_cast<double>(out[0].spec.bytes()));
  };
  m["concat"] = [](SpecList in, const Outputs&) { return reference(0, 2 * fbytes(in)); };
  m["layernorm"] = [](SpecList in, const Outputs&) {
    return reference(8.0 * in[0].numel(), 2 * fbytes(in));
  };
  m["layernorm_backward"] = [](SpecList in, const Outputs&) {
    return reference(12.0 * in[0].numel(), 2 * fbytes(in));
  };
  m["batchnorm"] = [](SpecList in, const Outputs&) {
    return reference(8.0 * in[0].numel(), 3 * fbytes(in));
  };
  m["batchnorm_backward"] = [](SpecList in, const Outputs&) {
    return reference(12.0 * in[0].numel(), 3 * fbytes(in));
  };
  m["batchnorm_running_update"] = [](SpecList in, const Outputs&) {
    return reference(4.0 * in[0].numel(), fbytes(in));
  };
  m["attention"] = [](SpecList in, const Outputs& out) {
    const auto& s = in[0].shape;
    const i64 heads = out[1].spec.shape[1];
    const double b = s[0], t = s[1], c = s[2] / 3;
    return reference(2.0 * b * t * t * c + 5.0 * b * heads * t * t,
                     fbytes(in) + 4.0 * (b * t * c + b * heads * t * t));
  };
  m["attention_backward"] = [](SpecList in, const Outputs&) {
    const auto& s = in[1].shape;
    const i64 heads = in[2].shape[1];  // att (B, NH, T, T)
    const double b = s[0], t = s[1], c = s[2] / 3;
    return reference(4.0 * b * t * t * c + 8.0 * b * heads * t * t, 2 * fbytes(in));
  };
  m["embedding"] = [](SpecList in, const Outputs&) {
    const double n = static_cast<double>(in[0].numel()) * in[1].shape[1];
    return reference(n, 12.0 * n);
  };
  m["embedding_backward"] = [](SpecList in, const Outputs& out) {
    return reference(static_cast<double>(in[0].numel()), fbytes(in) + 2.0 * out[0].spec.bytes());
  };
  m["cross_entropy"] = [](SpecList in, const Outputs&) {
    return reference(4.0 * in[0].numel(), fbytes(in));
  };
  m["cross_entropy_backward"] = [](SpecList in, const Outputs&) {
    return reference(5.0 * in[0].numel(), 2 * fbytes(in));
  };
  m["dropout"] = [](SpecList in, const Outputs&) {
    return reference(10.0 * in[0].numel(), 2.25 * in[0].bytes());
  };
  m["dropout_backward"] = [](SpecList in, const Outputs&) {
    return reference(static_cast<double>(in[0].numel()), fbytes(in) * 1.5);
  };
  m["conv2d"] = [](SpecList in, const Outputs&) {
    double out_elems = 0;
    const double flops = conv_flops_and_out(in, 0, 1, &out_elems);
    return reference(flops, fbytes(in) + out_elems);
  };
  m["conv2d_backward"] = [](SpecList in, const Outputs& out) {
    double unused = 0;
    const bool need_dx = out[0].spec == in[1];  // dx first, shaped like x (not like w)
    return reference((need_dx ? 2 : 1) * conv_flops_and_out(in, 1, 2, &unused), 2 * fbytes(in));
  };
  m["maxpool2d"] = [](SpecList in, const Outputs&) {
    return reference(static_cast<double>(in[0].numel()) * kPoolK * kPoolK / (kPoolS * kPoolS),
                     1.5 * fbytes(in));
  };
  m["maxpool2d_backward"] = [](SpecList in, const Outputs& out) {
    const TensorSpec& x = out[0].spec;
    return reference(static_cast<double>(x.numel()), fbytes(in) + x.bytes());
  };
  m["avgpool_backward"] = [](SpecList, const Outputs& out) {
    const TensorSpec& x = out[0].spec;
    return reference(static_cast<double>(x.numel()), 1.25 * x.bytes());
  };
  m["adamw"] = [](SpecList in, const Outputs&) {
    return reference(10.0 * in[0].numel(), 7.0 * in[0].bytes());
  };
  return m;
}

// An op as the observer saw it: the definition and the input specs of one call.
struct Seen {
  OpPtr op;
  std::vector<TensorSpec> inputs;
};

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_op_observer([this](const OpDef& op, SpecList in) {
      // The ops keep their definitions alive (cached or held by the runtime's lineage), but a
      // copy keeps this test independent of how long they do.
      seen_.push_back({std::make_shared<OpDef>(op), std::vector<TensorSpec>(in.begin(), in.end())});
    });
  }
  void TearDown() override { set_op_observer({}); }

  // A pinned tensor of zeros (int32 zeros are valid token ids and targets).
  Tensor zeros_constant(std::vector<i64> shape, DType dtype = DType::kF32) {
    const TensorSpec spec{std::move(shape), dtype};
    std::vector<unsigned char> bytes(spec.bytes());
    return rt_.constant(spec, bytes.data());
  }

  // Calls every function of kernels/ops.h at least once, on small shapes.
  void call_every_op() {
    Tensor x = zeros_constant({4, 6}), w = zeros_constant({5, 6}), bias = zeros_constant({5});
    Tensor y = linear(rt_, x, w, bias);
    linear(rt_, x, w);
    matmul(rt_, x, zeros_constant({6, 5}));
    matmul(rt_, x, w, false, true);
    matmul(rt_, x, zeros_constant({4, 5}), true, false);
    matmul(rt_, x, zeros_constant({5, 4}), true, true);
    Tensor yb = bias_add(rt_, y, bias);
    bias_grad(rt_, yb);
    add(rt_, y, yb);
    mul(rt_, y, yb);
    scale(rt_, y, 0.5f);
    sum(rt_, y);
    zeros(rt_, TensorSpec{{3, 7}, DType::kF32});
    gelu_backward(rt_, y, gelu(rt_, y));
    relu_backward(rt_, y, relu(rt_, y));
    sigmoid_backward(rt_, sigmoid(rt_, y), y);
    tanh_backward(rt_, tanh(rt_, y), y);
    softmax_backward(rt_, softmax(rt_, y), y);
    reshape(rt_, y, {20});
    narrow(rt_, y, 5, {2, 5});
    concat(rt_, {y, yb, narrow(rt_, y, 0, {1, 5})});

    const i64 b = 2, t = 3, c = 8, heads = 2, vocab = 11;
    Tensor ln_in = zeros_constant({b, t, c});
    LayerNormOut ln = layernorm(rt_, ln_in, zeros_constant({c}), zeros_constant({c}));
    layernorm_backward(rt_, ln.y, ln_in, zeros_constant({c}), ln.mean, ln.rstd);
    Tensor qkv = zeros_constant({b, t, 3 * c});
    AttentionOut att = attention(rt_, qkv, heads);
    attention_backward(rt_, att.out, qkv, att.att, heads);
    Tensor idx = zeros_constant({b, t}, DType::kI32);
    Tensor wte = zeros_constant({vocab, c}), wpe = zeros_constant({t + 2, c});
    Tensor emb = embedding(rt_, idx, wte, wpe);
    embedding(rt_, idx, wte);
    embedding_backward(rt_, emb, idx, wte.spec(), nullptr);
    const TensorSpec wpe_spec = wpe.spec();
    embedding_backward(rt_, emb, idx, wte.spec(), &wpe_spec);
    Tensor logits = zeros_constant({b * t, vocab});
    Tensor targets = zeros_constant({b * t}, DType::kI32);
    Tensor loss = cross_entropy(rt_, logits, targets);
    cross_entropy_backward(rt_, logits, targets, sum(rt_, loss), 0.5f);
    DropoutOut drop = dropout(rt_, ln.y, 0.25f);
    dropout_backward(rt_, drop.y, drop.mask, 0.25f);

    Tensor img = zeros_constant({2, 3, 8, 8}), filt = zeros_constant({4, 3, 3, 3});
    Tensor conv = conv2d(rt_, img, filt, zeros_constant({4}), kStride, kPad);
    conv2d(rt_, img, filt, Tensor(), kStride, kPad);
    for (bool has_bias : {false, true})
      for (bool need_dx : {false, true})
        conv2d_backward(rt_, conv, img, filt, has_bias, need_dx, kStride, kPad);
    Tensor gamma = zeros_constant({4}), beta = zeros_constant({4});
    BatchNormOut bn = batchnorm(rt_, conv, gamma, beta);
    batchnorm_backward(rt_, bn.y, conv, gamma, bn.mean, bn.rstd);
    batchnorm_running_update(rt_, zeros_constant({4}), zeros_constant({4}), bn.mean, bn.rstd,
                             2 * 4 * 4);
    MaxPoolOut pool = maxpool2d(rt_, bn.y, kPoolK, kPoolS);
    maxpool2d_backward(rt_, pool.y, pool.argmax, bn.y.spec(), kPoolK, kPoolS);
    Tensor avg = avgpool(rt_, pool.y);
    avgpool_backward(rt_, avg, pool.y.spec());

    Tensor param = zeros_constant({5, 6}), m = zeros_constant({5, 6}), v = zeros_constant({5, 6});
    adamw(rt_, param, m, v, zeros_constant({5, 6}), AdamW{}, 1);
  }

  Runtime rt_{RuntimeOptions{}};
  std::vector<Seen> seen_;
};

TEST_F(OpsTest, EveryOpDeclaresTheWorkOfItsReferenceFormula) {
  call_every_op();
  const std::map<std::string, Formula> formulas = reference_formulas();
  std::set<std::string> checked;
  for (const Seen& s : seen_) {
    const OpDef& op = *s.op;
    SCOPED_TRACE(op.name);
    ASSERT_TRUE(op.cost) << "every op declares a cost";
    const double cost = op.cost(s.inputs);
    if (op.name == "view") {
      // Views launch nothing: a token cost, no work a roofline would charge a launch for.
      EXPECT_FALSE(op.work);
      EXPECT_EQ(cost, 1.0);
      continue;
    }
    ASSERT_TRUE(op.work) << "an op that runs a kernel declares its work";
    const OpWork work = op.work(s.inputs);
    EXPECT_GT(work.bytes, 0.0);
    EXPECT_EQ(cost, Roofline::cpu().price(work));
    auto it = formulas.find(op.name);
    ASSERT_NE(it, formulas.end()) << "an op this test has no reference formula for";
    const ReferenceWork was = it->second(s.inputs, op.infer(s.inputs));
    EXPECT_EQ(cost, was.ns());
    // Both terms, not just the larger one these shapes happen to price by: on a roofline of
    // another balance the other one decides.
    EXPECT_EQ(work.flops, was.flops);
    EXPECT_EQ(work.bytes, was.bytes);
    checked.insert(op.name);
  }
  for (const auto& [name, formula] : formulas)
    EXPECT_EQ(checked.count(name), 1u) << name << ": never called";
}

}  // namespace
}  // namespace remat::ops
