#include "pytorch/detail/op_work.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace remat::torch_backend::detail {
namespace {

// Note [Costs without a clock]
// DTR weighs a tensor by what recomputing it costs. Timed on the CPU the device runs on,
// those costs change from run to run by tens of percent, and so do the evictions: two runs of
// one program recompute different tensors, and a test of a budget near its edge passes on one
// run and not the next. Estimated from what the call does, a cost is the same on every run:
// its memory traffic (the bytes of its tensor arguments and fresh results), and its
// arithmetic, one operation an element for the element-wise bulk and the products' own counts
// for matrix products, convolutions and attention, where the arithmetic dominates. The
// runtime prices the two with its roofline (RuntimeOptions::roofline: a 2-core CPU's by
// default), the same model the C++ driver's estimated costs use. Only ratios between ops steer
// eviction, so a rough count in the right proportion is enough.

double numel(const Layout& l) {
  double n = 1;
  for (std::int64_t s : l.sizes) n *= static_cast<double>(s);
  return n;
}

double bytes_of(const Layout& l) {
  return numel(l) * static_cast<double>(c10::elementSize(l.dtype));
}

// The tensor of schema argument `argument`, or null.
const Layout* argument_layout(const TorchCall& call, int argument) {
  for (const TensorArg& t : call.tensors)
    if (t.argument == argument && t.kind == TensorArg::Kind::kDevice) return &t.layout;
  return nullptr;
}

double fresh_elements(const TorchCall& call) {
  double n = 0;
  for (const Layout& l : call.fresh) n += numel(l);
  return n;
}

// Multiply-adds of a matrix product whose first factor is `argument`: two operations for
// each element of the result and each term of its inner dimension.
double product_flops(const TorchCall& call, int argument) {
  const Layout* a = argument_layout(call, argument);
  if (a == nullptr || a->sizes.empty()) return fresh_elements(call);
  return 2 * fresh_elements(call) * static_cast<double>(a->sizes.back());
}

// A convolution: each result element sums over the weight's input channels and window.
double convolution_flops(const TorchCall& call, int weight_argument, double results) {
  const Layout* w = argument_layout(call, weight_argument);
  if (w == nullptr || w->sizes.empty() || w->sizes[0] == 0) return results;
  return 2 * results * numel(*w) / static_cast<double>(w->sizes[0]);
}

// Attention over queries (argument `q`, ..., L, E) and keys (`q` + 1, ..., S, E): two
// products of L x S x E per batch and head.
double attention_flops(const TorchCall& call, int q) {
  const Layout* query = argument_layout(call, q);
  const Layout* key = argument_layout(call, q + 1);
  if (query == nullptr || key == nullptr || key->sizes.size() < 2) return fresh_elements(call);
  return 4 * numel(*query) * static_cast<double>(key->sizes[key->sizes.size() - 2]);
}

double flops_of(const TorchCall& call) {
  const std::string& name = call.op.schema().name();
  const bool backward = name.find("backward") != std::string::npos;
  if (name == "aten::mm" || name == "aten::bmm" || name == "aten::matmul")
    return product_flops(call, 0);
  if (name == "aten::addmm" || name == "aten::baddbmm" || name == "aten::addbmm")
    return product_flops(call, 1);
  if (name.find("convolution") != std::string::npos) {
    if (!backward) return convolution_flops(call, 1, fresh_elements(call));
    const Layout* grad = argument_layout(call, 0);  // (grad_output, input, weight, ...)
    return 2 * convolution_flops(call, 2, grad == nullptr ? 0 : numel(*grad));
  }
  if (name.find("scaled_dot_product") != std::string::npos)
    return backward ? 2.5 * attention_flops(call, 1) : attention_flops(call, 0);
  return fresh_elements(call);
}

}  // namespace

OpWork estimated_work(const TorchCall& call) {
  OpWork w;
  for (const TensorArg& t : call.tensors)
    if (t.kind == TensorArg::Kind::kDevice) w.bytes += bytes_of(t.layout);
  for (const Layout& l : call.fresh) w.bytes += bytes_of(l);
  w.flops = flops_of(call);
  return w;
}

}  // namespace remat::torch_backend::detail
