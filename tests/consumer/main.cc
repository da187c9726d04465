// The README's runtime snippet, an op from the op library and a planner call, built against
// the installed package. Exits 0 when a budgeted run matches the unconstrained one bit for bit.
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "remat/planner.h"
#include "remat/runtime.h"

namespace {

// The README's user op: any kernel wrapped with remat::make_op.
remat::OpPtr my_scale_op() {
  return remat::make_op(
      "scale", [](remat::SpecList in) { return remat::Outputs{{in[0]}}; },
      [](const remat::KernelContext& k) {
        for (int64_t i = 0; i < k.input_spec(0).numel(); ++i)
          k.output<float>(0)[i] = 0.5f * k.input<float>(0)[i] + 1.0f;
      },
      [](remat::SpecList in) { return double(in[0].numel()); });
}

std::vector<float> run(std::size_t budget) {
  remat::Runtime rt({.backend = remat::Backend::kCpu, .budget = budget, .policy = "dtr"});
  std::vector<float> weights(512 * 512, 0.001f);
  remat::Tensor w = rt.constant({{512, 512}, remat::DType::kF32}, weights.data());  // pinned
  std::vector<remat::Tensor> hs{rt.call1(my_scale_op(), {w})};
  for (int i = 0; i < 16; ++i) hs.push_back(remat::ops::matmul(rt, hs.back(), w));
  std::vector<float> host(512 * 512);
  rt.read(hs.back(), host.data());  // recomputed if it was evicted
  std::printf("budget %zu: evictions %zu, peak reserved %zu\n", budget, rt.stats().evictions,
              rt.stats().memory.peak_reserved);
  return host;
}

}  // namespace

int main() {
  const std::vector<float> free_run = run(SIZE_MAX);
  const std::vector<float> tight = run(std::size_t{12} << 20);
  const bool same = std::memcmp(free_run.data(), tight.data(), free_run.size() * 4) == 0;

  absl::StatusOr<remat::Graph> parsed = remat::parse_graph(R"({"format": "remat-graph-v1",
      "name": "chain", "outputs": [3], "nodes": [
        {"id": 0, "name": "x", "kind": "input", "phase": "forward", "bytes": 100, "cost": 0,
         "inputs": []},
        {"id": 1, "name": "y", "kind": "compute", "phase": "forward", "bytes": 100, "cost": 1,
         "inputs": [0]},
        {"id": 2, "name": "z", "kind": "compute", "phase": "forward", "bytes": 100, "cost": 1,
         "inputs": [1]},
        {"id": 3, "name": "dy", "kind": "compute", "phase": "backward", "bytes": 100,
         "cost": 1, "inputs": [1, 2]}]})");
  if (!parsed.ok()) {
    std::printf("parse_graph: %s\n", std::string(parsed.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<remat::Plan> plan = remat::run_planner("chen", *parsed, remat::PlanOptions());
  const bool planned = plan.ok() && plan->feasible;
  std::printf("bitwise %s, plan %s\n", same ? "yes" : "no", planned ? "feasible" : "none");
  return same && planned ? 0 : 1;
}
