#include "examples/plain_c/gpt2_ops.h"

#include <cstdint>

#include "examples/plain_c/gpt2_kernels.h"
#include "examples/plain_c/kernels.h"

namespace plain_c::gpt2 {
namespace {

using remat::KernelContext;
using remat::OpWork;
using remat::Outputs;
using remat::SpecList;
using remat::TensorSpec;

int last(const TensorSpec& s) { return static_cast<int>(s.shape.back()); }
int rows(const TensorSpec& s) { return static_cast<int>(s.numel() / s.shape.back()); }
double count(const TensorSpec& s) { return static_cast<double>(s.numel()); }

// `s` with its last dimension replaced by `n`.
TensorSpec with_last(const TensorSpec& s, std::int64_t n) {
  TensorSpec out = s;
  out.shape.back() = n;
  return out;
}

// The (B, T, C) sizes an attention op reads off its (B, T, 3C) qkv.
struct AttentionSizes {
  int B, T, C;
  explicit AttentionSizes(const TensorSpec& qkv)
      : B(static_cast<int>(qkv.shape[0])),
        T(static_cast<int>(qkv.shape[1])),
        C(static_cast<int>(qkv.shape[2] / 3)) {}
  std::size_t region_bytes(int heads) const {
    return attention_region_floats(B, T, heads) * sizeof(float);
  }
  // Each of q.k and att.v is hs multiply-adds per (b, h, t, t2) pair, half of them masked.
  double flops() const { return 2.0 * B * T * T * C; }
};

remat::OpPtr elementwise(const char* name, int inputs, void (*kernel)(const KernelContext&, int)) {
  return remat::make_op_with_work(
      name, [](SpecList in) { return Outputs{{in[0]}}; },
      [kernel](const KernelContext& k) { kernel(k, static_cast<int>(k.input_spec(0).numel())); },
      [inputs](SpecList in) {
        return OpWork{.flops = 8 * count(in[0]), .bytes = 4 * count(in[0]) * (inputs + 1)};
      });
}

}  // namespace

remat::OpPtr encoder_op() {
  return remat::make_op_with_work(
      "gpt2_encoder",
      [](SpecList in) {
        return Outputs{{TensorSpec{{in[0].shape[0], in[0].shape[1], in[1].shape[1]}}}};
      },
      [](const KernelContext& k) {
        const TensorSpec& tokens = k.input_spec(0);
        encoder_forward(k.output<float>(0), k.input<std::int32_t>(0), k.input<float>(1),
                        k.input<float>(2), static_cast<int>(tokens.shape[0]),
                        static_cast<int>(tokens.shape[1]), last(k.input_spec(1)));
      },
      [](SpecList in) {
        const double n = count(in[0]) * static_cast<double>(in[1].shape[1]);
        return OpWork{.flops = n, .bytes = 12 * n};
      });
}

remat::OpPtr encoder_backward_op() {
  return remat::make_op_with_work(
      "gpt2_encoder_backward", [](SpecList) { return Outputs{}; },
      [](const KernelContext& k) {
        const TensorSpec& dout = k.input_spec(2);
        encoder_backward(k.output<float>(0), k.output<float>(1), k.input<float>(2),
                         k.input<std::int32_t>(3), static_cast<int>(dout.shape[0]),
                         static_cast<int>(dout.shape[1]), last(dout));
      },
      [](SpecList in) { return OpWork{.flops = 2 * count(in[2]), .bytes = 20 * count(in[2])}; });
}

remat::OpPtr layernorm_op() {
  return remat::make_op_with_work(
      "gpt2_layernorm",
      [](SpecList in) {
        const TensorSpec stats{{rows(in[0])}};
        return Outputs{{in[0]}, {stats}, {stats}};
      },
      [](const KernelContext& k) {
        layernorm_forward(k.output<float>(0), k.output<float>(1), k.output<float>(2),
                          k.input<float>(0), k.input<float>(1), k.input<float>(2),
                          rows(k.input_spec(0)), last(k.input_spec(0)));
      },
      [](SpecList in) { return OpWork{.flops = 8 * count(in[0]), .bytes = 8 * count(in[0])}; });
}

remat::OpPtr layernorm_backward_op() {
  return remat::make_op_with_work(
      "gpt2_layernorm_backward", [](SpecList in) { return Outputs{{in[1]}}; },
      [](const KernelContext& k) {
        layernorm_backward(k.output<float>(0), k.output<float>(1), k.output<float>(2),
                           k.input<float>(0), k.input<float>(1), k.input<float>(2),
                           k.input<float>(3), k.input<float>(4), rows(k.input_spec(1)),
                           last(k.input_spec(1)));
      },
      [](SpecList in) { return OpWork{.flops = 12 * count(in[1]), .bytes = 12 * count(in[1])}; });
}

remat::OpPtr matmul_op() {
  return remat::make_op_with_work(
      "gpt2_matmul", [](SpecList in) { return Outputs{{with_last(in[0], in[1].shape[0])}}; },
      [](const KernelContext& k) {
        matmul_forward(k.output<float>(0), k.input<float>(0), k.input<float>(1), k.input<float>(2),
                       rows(k.input_spec(0)), last(k.input_spec(0)),
                       static_cast<int>(k.input_spec(1).shape[0]));
      },
      [](SpecList in) {
        const double r = rows(in[0]), c = last(in[0]), oc = static_cast<double>(in[1].shape[0]);
        return OpWork{.flops = 2 * r * c * oc, .bytes = 4 * (r * c + oc * c + r * oc)};
      });
}

remat::OpPtr matmul_backward_op() {
  return remat::make_op_with_work(
      "gpt2_matmul_backward", [](SpecList in) { return Outputs{{in[1]}}; },
      [](const KernelContext& k) {
        matmul_backward(k.output<float>(0), k.output<float>(1), k.output<float>(2),
                        k.input<float>(0), k.input<float>(1), k.input<float>(2),
                        rows(k.input_spec(1)), last(k.input_spec(1)),
                        static_cast<int>(k.input_spec(2).shape[0]));
      },
      [](SpecList in) {
        const double r = rows(in[1]), c = last(in[1]), oc = static_cast<double>(in[2].shape[0]);
        return OpWork{.flops = 4 * r * c * oc, .bytes = 8 * (r * c + oc * c + r * oc)};
      });
}

remat::OpPtr attention_op(int heads) {
  remat::OpPtr op = remat::make_op_with_work(
      "gpt2_attention", [](SpecList in) { return Outputs{{with_last(in[0], in[0].shape[2] / 3)}}; },
      [heads](const KernelContext& k) {
        const AttentionSizes s(k.input_spec(0));
        auto* att = static_cast<float*>(k.scratch(s.region_bytes(heads)));
        attention_forward(k.output<float>(0), k.input<float>(0), att, s.B, s.T, s.C, heads);
      },
      [heads](SpecList in) {
        // qkv read and out written; the probabilities written, then read.
        const AttentionSizes s(in[0]);
        return OpWork{.flops = s.flops(),
                      .bytes = 16.0 * s.B * s.T * s.C + 2.0 * s.region_bytes(heads)};
      });
  return remat::with_scratch(
      op, [heads](SpecList in) { return AttentionSizes(in[0]).region_bytes(heads); });
}

remat::OpPtr attention_backward_op(int heads) {
  remat::OpPtr op = remat::make_op_with_work(
      "gpt2_attention_backward", [](SpecList in) { return Outputs{{in[1]}}; },
      [heads](const KernelContext& k) {
        const AttentionSizes s(k.input_spec(1));
        auto* scratch = static_cast<float*>(k.scratch(2 * s.region_bytes(heads)));
        attention_backward(k.output<float>(0), k.input<float>(0), k.input<float>(1), scratch, s.B,
                           s.T, s.C, heads);
      },
      [heads](SpecList in) {
        // q.k again, then passes like it for the gradients of the values, the probabilities,
        // the queries and the keys: five to the forward's two. dout and qkv read, dqkv
        // written; the probabilities written and read twice, their gradient written, read,
        // written again and read.
        const AttentionSizes s(in[1]);
        return OpWork{.flops = 2.5 * s.flops(),
                      .bytes = 28.0 * s.B * s.T * s.C + 7.0 * s.region_bytes(heads)};
      });
  return remat::with_scratch(
      op, [heads](SpecList in) { return 2 * AttentionSizes(in[1]).region_bytes(heads); });
}

remat::OpPtr gelu_op() {
  return elementwise("gpt2_gelu", 1, [](const KernelContext& k, int n) {
    gelu_forward(k.output<float>(0), k.input<float>(0), n);
  });
}

remat::OpPtr gelu_backward_op() {
  return elementwise("gpt2_gelu_backward", 2, [](const KernelContext& k, int n) {
    gelu_backward(k.output<float>(0), k.input<float>(0), k.input<float>(1), n);
  });
}

remat::OpPtr add_op() {
  return elementwise("gpt2_add", 2, [](const KernelContext& k, int n) {
    add_forward(k.output<float>(0), k.input<float>(0), k.input<float>(1), n);
  });
}

remat::OpPtr crossentropy_op() {
  return remat::make_op_with_work(
      "gpt2_crossentropy",
      [](SpecList in) {
        return Outputs{{TensorSpec{{1}}}, {in[0]}};
      },
      [](const KernelContext& k) {
        crossentropy_forward(k.output<float>(0), k.output<float>(1), k.input<float>(0),
                             k.input<std::int32_t>(1), rows(k.input_spec(0)),
                             last(k.input_spec(0)));
      },
      [](SpecList in) { return OpWork{.flops = 20 * count(in[0]), .bytes = 8 * count(in[0])}; });
}

remat::OpPtr crossentropy_backward_op() {
  return remat::make_op_with_work(
      "gpt2_crossentropy_backward", [](SpecList in) { return Outputs{{in[0]}}; },
      [](const KernelContext& k) {
        crossentropy_backward(k.output<float>(0), k.input<float>(0), k.input<std::int32_t>(1),
                              rows(k.input_spec(0)), last(k.input_spec(0)));
      },
      [](SpecList in) { return OpWork{.flops = 2 * count(in[0]), .bytes = 8 * count(in[0])}; });
}

remat::OpPtr zero_op() {
  return remat::make_op_with_work(
      "gpt2_zero", [](SpecList) { return Outputs{}; },
      [](const KernelContext& k) {
        for (std::size_t i = 0; i < k.outputs.size(); ++i)
          zero(k.output<float>(i), static_cast<std::size_t>(k.output_spec(i).numel()));
      },
      [](SpecList in) {
        double n = 0;
        for (const TensorSpec& s : in) n += count(s);
        return OpWork{.flops = 0, .bytes = 4 * n};
      });
}

remat::OpPtr adamw_op(float lr, int t) {
  return remat::make_op_with_work(
      "gpt2_adamw", [](SpecList) { return Outputs{}; },
      [lr, t](const KernelContext& k) {
        adamw(k.output<float>(0), k.input<float>(1), k.output<float>(1), k.output<float>(2),
              static_cast<std::size_t>(k.input_spec(0).numel()), lr, t);
      },
      [](SpecList in) { return OpWork{.flops = 12 * count(in[0]), .bytes = 28 * count(in[0])}; });
}

}  // namespace plain_c::gpt2
