// The usage example at the top of every public header (include/remat/*.h), compiled and run
// on small real inputs. Each TEST makes the same calls, with the same names, as its header's
// comment, so that a comment that drifts from the API fails to build here. Inputs are small
// graphs built in code, small runtimes (CPU or simulated backend), or files from
// ../shared (REMAT_SHARED_DIR); a test that needs a shared file skips where it is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/autograd.h"
#include "kernels/ops.h"
#include "remat/byte_size.h"
#include "remat/caching_allocator.h"
#include "remat/cuda_api.h"
#include "remat/dtr_trace.h"
#include "remat/errors.h"
#include "remat/graph.h"
#include "remat/graph_transforms.h"
#include "remat/hints.h"
#include "remat/logical_memory.h"
#include "remat/memory_resource.h"
#include "remat/op.h"
#include "remat/plan_cache.h"
#include "remat/planner.h"
#include "remat/replay.h"
#include "remat/runtime.h"
#include "remat/schedule.h"
#include "remat/segment_source.h"
#include "remat/static_replay.h"
#include "remat/step_driver.h"
#include "remat/step_planner.h"
#include "remat/system_cuda.h"
#include "remat/tensor.h"
#include "remat/timeline.h"
#include "remat/timeline_file.h"
#include "runtime/cuda/simulated_cuda.h"
#include "tests/support/test_ops.h"

namespace {

// A file under ../shared, or "" where it is absent.
std::string shared_file(const std::string& relative) {
  const std::filesystem::path p = std::filesystem::path(REMAT_SHARED_DIR) / relative;
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) ? p.string() : std::string();
}

// The op of op.h's example, which tensor.h's example runs.
remat::OpPtr relu_op() {
  return remat::make_op(
      "relu", [](remat::SpecList in) { return remat::Outputs{{in[0]}}; },  // same shape as input
      [](const remat::KernelContext& k) {
        auto* x = k.input<float>(0);
        auto* y = k.output<float>(0);
        for (int64_t i = 0; i < k.input_spec(0).numel(); ++i) y[i] = x[i] > 0 ? x[i] : 0;
      },
      [](remat::SpecList in) { return double(in[0].numel()); });  // declared cost
}

// [m, k] x [k, n] -> [m, n], float32, naive.
remat::OpPtr matmul_op() {
  return remat::make_op(
      "matmul",
      [](remat::SpecList in) {
        return remat::Outputs{
            {remat::TensorSpec{{in[0].shape[0], in[1].shape[1]}, remat::DType::kF32}}};
      },
      [](const remat::KernelContext& k) {
        const float* a = k.input<float>(0);
        const float* b = k.input<float>(1);
        float* c = k.output<float>(0);
        const int64_t m = k.input_spec(0).shape[0], kk = k.input_spec(0).shape[1],
                      n = k.input_spec(1).shape[1];
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            float acc = 0;
            for (int64_t p = 0; p < kk; ++p) acc += a[i * kk + p] * b[p * n + j];
            c[i * n + j] = acc;
          }
      },
      [](remat::SpecList in) {
        return double(in[0].shape[0]) * double(in[0].shape[1]) * double(in[1].shape[1]);
      });
}

remat::Node make_node(int id, int64_t bytes, double cost, std::vector<int> inputs,
                      remat::Phase phase, remat::NodeKind kind = remat::NodeKind::kCompute) {
  remat::Node n;
  n.id = id;
  n.name = "n" + std::to_string(id);
  n.op = kind == remat::NodeKind::kInput ? "input" : "op";
  n.kind = kind;
  n.phase = phase;
  n.bytes = bytes;
  n.cost = cost;
  n.inputs = std::move(inputs);
  return n;
}

// Checkmate's gen_linear_graph(n): 2n+1 unit nodes, i -> i+1 and i -> 2n-i for i < n.
remat::Graph linear_graph(int n) {
  remat::Graph g;
  g.name = "linear" + std::to_string(n);
  for (int i = 0; i <= 2 * n; ++i) {
    std::vector<int> in;
    if (i > 0) in.push_back(i - 1);
    if (i > n) in.push_back(2 * n - i);
    g.nodes.push_back(
        make_node(i, 1, 1, in, i <= n ? remat::Phase::kForward : remat::Phase::kBackward));
  }
  g.outputs = {2 * n};
  return g;
}

// A recorded training-like step on `rt`: a forward chain of `n` ops over a parameter, then a
// backward chain that reads the forward values in reverse. Returns the value read back.
float run_step(remat::Runtime& rt, const remat::Tensor& w, const remat::Tensor& x, int n);

// The value run_step computes with no budget and no hints, and the peak allocated bytes.
struct Unconstrained {
  float value = 0;
  std::size_t peak = 0;
};
Unconstrained run_unconstrained(const std::vector<float>& wv, const std::vector<float>& xv, int n,
                                remat::Accounting accounting) {
  remat::Runtime plain({.backend = remat::Backend::kCpu, .accounting = accounting});
  remat::Tensor w = plain.constant(remat::testing::vec(64), wv.data());
  remat::Tensor x = plain.constant(remat::testing::vec(64), xv.data());
  plain.begin_step();
  Unconstrained u;
  u.value = run_step(plain, w, x, n);
  plain.end_step();
  u.peak = plain.stats().memory.peak_allocated;
  return u;
}

float run_step(remat::Runtime& rt, const remat::Tensor& w, const remat::Tensor& x, int n) {
  const remat::OpPtr f = remat::testing::affine(0.5f, 1.0f);
  const remat::OpPtr c = remat::testing::combine();
  std::vector<remat::Tensor> acts;
  remat::Tensor h = rt.call1(c, {x, w});
  for (int i = 0; i < n; ++i) {
    h = rt.call1(f, {h});
    acts.push_back(h);
  }
  rt.mark_backward();
  remat::Tensor g = rt.call1(f, {h});
  for (int i = n - 1; i >= 0; --i) {
    g = rt.call1(c, {g, acts[static_cast<std::size_t>(i)]});
    acts[static_cast<std::size_t>(i)].reset();
  }
  float out = 0;
  if (rt.options().backend != remat::Backend::kSimulated) out = rt.data<float>(g)[0];
  return out;
}

// ---------------------------------------------------------------------------------------------

TEST(HeaderExamples, CachingAllocator) {
  remat::CachingAllocator alloc(std::make_unique<remat::HostSegmentSource>(),
                                {.budget = size_t{256} << 20});
  void* p = alloc.allocate(4096);  // one pool under a budget: a 20 MiB segment
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(alloc.stats().reserved, size_t{20} << 20);
  EXPECT_EQ(alloc.stats().allocated, 4096u);
  alloc.deallocate(p, 4096);  // cached, not returned to the source
  EXPECT_EQ(alloc.stats().allocated, 0u);
  EXPECT_EQ(alloc.stats().reserved, size_t{20} << 20);
  EXPECT_LE(alloc.stats().peak_reserved, alloc.budget());  // never above the budget

  // Without a budget, PyTorch's two pools: a small request takes a 2 MiB small-pool segment.
  remat::CachingAllocator unbounded(std::make_unique<remat::HostSegmentSource>());
  void* q = unbounded.allocate(4096);
  EXPECT_EQ(unbounded.stats().reserved, size_t{2} << 20);
  unbounded.deallocate(q, 4096);
}

// cuda_api.h's example, with the simulated device standing in for the CUDA runtime.
TEST(HeaderExamples, CudaApi) {
  std::shared_ptr<remat::CudaApi> api =
      std::make_shared<remat::SimulatedCuda>(remat::SimulatedCudaOptions{.devices = 2});
  ASSERT_TRUE(remat::cuda_device_available(api.get()));
  remat::CudaStream my_stream = nullptr;
  api->stream_create(&my_stream);
  remat::Runtime rt({.backend = remat::Backend::kCuda,
                     .budget = std::size_t{8} << 30,
                     .cuda = {.device = 1, .stream = my_stream, .api = api}});
  EXPECT_EQ(rt.stream(), my_stream);
  EXPECT_EQ(rt.options().cuda.device, 1);
}

TEST(HeaderExamples, DtrTrace) {
  const std::string path = shared_file("traces/dtr/resnet32.log");
  if (path.empty()) GTEST_SKIP() << "no ../shared/traces/dtr/resnet32.log";
  absl::StatusOr<remat::DtrTrace> trace = remat::read_dtr_trace_file(path);
  if (!trace.ok()) std::cerr << trace.status();  // names the offending line
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_FALSE(trace->instructions.empty());
  EXPECT_GT(trace->total_time_ns, 0u);
  for (const remat::DtrInstruction& in : trace->instructions)
    for (std::uint32_t h : in.args) ASSERT_LT(h, trace->handle_names.size());

  // An error names the offending line.
  std::istringstream bad(
      "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n"
      "{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"16\",\"NAME\":\"x\"}\n");
  absl::StatusOr<remat::DtrTrace> broken = remat::parse_dtr_trace(bad, "bad.log");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(std::string(broken.status().message()).find("bad.log:2"), std::string::npos)
      << broken.status();
}

TEST(HeaderExamples, Errors) {
  remat::Runtime rt({.backend = remat::Backend::kCpu,
                     .accounting = remat::Accounting::kLogical,
                     .budget = 3 * 16 * 16 * sizeof(float)});
  const std::vector<float> ident = [] {
    std::vector<float> v(16 * 16, 0.0f);
    for (int i = 0; i < 16; ++i) v[static_cast<std::size_t>(i * 16 + i)] = 1.0f;
    return v;
  }();
  const std::vector<float> values = remat::testing::iota(16 * 16, 0.0f);
  remat::Tensor a = rt.constant({{16, 16}}, values.data());  // pinned: 2 x 1 KiB of 3 KiB
  remat::Tensor b = rt.constant({{16, 16}}, ident.data());
  remat::Tensor keep = rt.constant({{16, 16}}, values.data());  // leaves no room for a result
  const remat::OpPtr matmul = matmul_op();
  bool threw = false;
  std::vector<remat::Tensor> result;
  try {
    auto out = rt.call(matmul, {a, b});
    result = out;
  } catch (const remat::OutOfMemoryError& e) {
    threw = true;
    std::cerr << e.what() << "\n";  // names the op, the budget, the request, what was pinned
    EXPECT_EQ(e.info().op, "matmul");
    EXPECT_EQ(e.budget(), 3 * 16 * 16 * sizeof(float));
    rt.set_budget(e.budget() * 2);  // the runtime is still usable
  }
  ASSERT_TRUE(threw);
  EXPECT_EQ(rt.stats().ooms, 1u);
  result = rt.call(matmul, {a, b});  // now it fits
  ASSERT_EQ(result.size(), 1u);
  std::vector<float> out(16 * 16);
  rt.read(result[0], out.data());
  EXPECT_EQ(out, values);  // a x I == a
}

TEST(HeaderExamples, Graph) {
  const std::string path = shared_file("graphs/rlg_n100.json");
  if (path.empty()) GTEST_SKIP() << "no ../shared/graphs/rlg_n100.json";
  absl::StatusOr<remat::Graph> g = remat::read_graph_file(path);
  if (!g.ok()) {
    std::cerr << g.status() << "\n";
    FAIL() << g.status();
  }
  int64_t total = 0;
  for (const remat::Node& n : g->nodes) total += n.bytes;
  EXPECT_EQ(g->size(), 100);
  EXPECT_GT(total, 0);
  EXPECT_TRUE(remat::validate_graph(*g).ok());
  std::string text = remat::write_graph(*g);  // round-trips through parse_graph
  absl::StatusOr<remat::Graph> again = remat::parse_graph(text);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(remat::write_graph(*again), text);
  // docs/formats.md: computing the nodes once in file order peaks at 46319 bytes.
  remat::Schedule in_order{.graph = g->name, .order = {}};
  for (int v = 0; v < g->size(); ++v) in_order.order.push_back(v);
  EXPECT_EQ(remat::simulate(*g, in_order).peak_bytes, 46319);
}

TEST(HeaderExamples, GraphTransforms) {
  remat::Runtime rt({.backend = remat::Backend::kCpu, .accounting = remat::Accounting::kLogical});
  const std::vector<float> wv = remat::testing::iota(64, 0.25f),
                           xv = remat::testing::iota(64, -3.0f);
  remat::Tensor w = rt.constant(remat::testing::vec(64), wv.data());
  remat::Tensor x = rt.constant(remat::testing::vec(64), xv.data());
  remat::StepOptions so;
  so.record = true;  // recorded with StepOptions::record
  rt.begin_step(so);
  run_step(rt, w, x, 6);
  remat::RecordedStep step = rt.end_step();
  ASSERT_GT(step.graph.size(), 0);
  remat::Graph g = remat::hold_inputs(step.graph);
  EXPECT_EQ(g.size(), step.graph.size() + 2);  // inputs_ready and hold_inputs
  absl::StatusOr<remat::Schedule> s =
      remat::realized_schedule(g, remat::recorded_sites(g), step.executed);
  ASSERT_TRUE(s.ok()) << s.status();
  const remat::SimResult sim = remat::simulate(g, *s);
  EXPECT_TRUE(sim.valid) << sim.error;
  EXPECT_EQ(sim.recomputations, 0);  // no budget: nothing recomputed
  remat::DtrTrace program = remat::dtr_trace_from_graph(g);
  EXPECT_FALSE(program.instructions.empty());
  const remat::ReplayResult r = remat::replay(program, remat::ReplayOptions{});
  EXPECT_EQ(r.status, "ok") << r.error;
  EXPECT_EQ(r.recomputations, 0u);
}

TEST(HeaderExamples, Hints) {
  const int64_t batch = 4, seq_len = 64;
  const std::vector<float> wv = remat::testing::iota(64, 0.25f),
                           xv = remat::testing::iota(64, -3.0f);
  // The value the step computes, with no budget and no hints.
  const float expected = run_unconstrained(wv, xv, 8, remat::Accounting::kAllocator).value;
  remat::Runtime rt({.backend = remat::Backend::kCpu,
                     .accounting = remat::Accounting::kLogical,
                     .policy = "hinted"});
  remat::Tensor w = rt.constant(remat::testing::vec(64), wv.data());
  remat::Tensor x = rt.constant(remat::testing::vec(64), xv.data());
  remat::PlanCache cache;
  remat::PlanOptions opt;
  for (int iteration = 0; iteration < 2; ++iteration) {
    const bool first_time = iteration == 0;
    remat::StepOptions so;
    so.hints = cache.find({batch, seq_len}).hints;
    EXPECT_EQ(so.hints == nullptr, first_time);
    so.record = first_time;
    rt.begin_step(so);
    EXPECT_EQ(run_step(rt, w, x, 8), expected);  // forward, rt.mark_backward(), backward
    remat::RecordedStep step = rt.end_step();    // the step as a graph and a trace
    if (!first_time) continue;
    ASSERT_GT(step.graph.size(), 0);
    remat::Plan plan = remat::run_planner("twremat", step.graph, opt).value();
    EXPECT_TRUE(plan.feasible) << plan.reason;
    cache.insert({batch, seq_len},
                 std::make_shared<remat::StepHints>(remat::hints_from_schedule(
                     step.graph, plan.schedule, remat::recorded_sites(step.graph), "twremat")));
    const remat::PlanCache::Found found = cache.find({batch, seq_len});
    ASSERT_NE(found.hints, nullptr);
    EXPECT_TRUE(found.exact);
    EXPECT_EQ(found.hints->source, "twremat");
    EXPECT_FALSE(found.hints->ops.empty());
    EXPECT_FALSE(found.hints->schedule.empty());
  }
  EXPECT_EQ(rt.stats().hint_mismatches, 0u);  // the second step made the same calls
}

TEST(HeaderExamples, LogicalMemory) {
  remat::LogicalMemory mem(/*budget=*/1 << 20, /*host=*/false);
  void* p = mem.allocate(1000);  // counts 1000 bytes
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(mem.stats().allocated, 1000u);
  EXPECT_EQ(mem.rounded_size(1000), 1000u);                      // no rounding
  EXPECT_THROW(mem.allocate(1 << 20), remat::OutOfMemoryError);  // 1000 + 1 MiB > budget
  mem.deallocate(p, 1000);
  EXPECT_EQ(mem.stats().allocated, 0u);
  EXPECT_EQ(mem.stats().peak_allocated, 1000u);
}

TEST(HeaderExamples, MemoryResource) {
  remat::CachingAllocator alloc(std::make_unique<remat::HostSegmentSource>(), {.budget = 64 << 20});
  remat::MemoryResource& resource = alloc;
  void* p = resource.allocate(1000);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[999] = 1;  // host memory: writable
  EXPECT_EQ(resource.rounded_size(1000), 1024u);
  EXPECT_EQ(resource.stats().allocated, 1024u);
  EXPECT_EQ(resource.stats().requested, 1000u);
  resource.deallocate(p, 1000);
  EXPECT_EQ(resource.stats().allocated, 0u);
  EXPECT_EQ(resource.stats().allocations, 1u);
  EXPECT_EQ(resource.budget(), size_t{64} << 20);
}

TEST(HeaderExamples, Op) {
  const auto relu = relu_op();  // op.h's example
  const remat::TensorSpec spec{{2, 3}, remat::DType::kF32};
  EXPECT_EQ(relu->name, "relu");
  EXPECT_EQ(relu->infer(remat::SpecList(&spec, 1)).at(0).spec, spec);
  EXPECT_EQ(relu->cost(remat::SpecList(&spec, 1)), 6.0);
  remat::Runtime rt({.backend = remat::Backend::kCpu});
  const std::vector<float> in = {-1, 2, -3, 4, -5, 6};
  remat::Tensor x = rt.constant(spec, in.data());
  remat::Tensor y = rt.call1(relu, {x});
  std::vector<float> out(6);
  rt.read(y, out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 2, 0, 4, 0, 6}));
  EXPECT_EQ(rt.clock(), 6.0);  // the declared cost

  // make_op_with_work: priced by the runtime's roofline, not a cost function.
  auto infer = [](remat::SpecList in) {
    return remat::Outputs{{remat::TensorSpec{{in[0].shape[0], in[1].shape[1]}}}};
  };
  auto kernel = [](const remat::KernelContext& k) {
    const std::int64_t m = k.input_spec(0).shape[0], kk = k.input_spec(0).shape[1],
                       n = k.input_spec(1).shape[1];
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        float acc = 0;
        for (std::int64_t p = 0; p < kk; ++p)
          acc += k.input<float>(0)[i * kk + p] * k.input<float>(1)[p * n + j];
        k.output<float>(0)[i * n + j] = acc;
      }
  };
  auto gemm = remat::make_op_with_work("my_gemm", infer, kernel, [](remat::SpecList in) {
    const double m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
    return remat::OpWork{.flops = 2 * m * k * n, .bytes = 4 * (m * k + k * n + m * n)};
  });
  const double before = rt.clock();
  remat::Tensor w = rt.constant({{3, 2}}, in.data());
  remat::Tensor z = rt.call1(gemm, {x, w});  // (2, 3) x (3, 2)
  EXPECT_EQ(rt.clock() - before,
            remat::Roofline::cpu().price({.flops = 2 * 2 * 3 * 2, .bytes = 4 * (6 + 6 + 4)}));
  std::vector<float> zs(4);
  rt.read(z, zs.data());
  EXPECT_EQ(zs[0], -1 * -1 + 2 * -3 + -3 * -5);
}

TEST(HeaderExamples, PlanCache) {
  const int64_t batch = 4, seq_len = 128;
  remat::PlanCache cache;
  auto h = std::make_shared<remat::StepHints>();
  h->source = "4x64";
  cache.insert({4, 64}, h);
  remat::PlanCache::Found f = cache.find({batch, seq_len}, remat::PlanCache::Reuse::kNoLarger);
  ASSERT_NE(f.hints, nullptr);
  EXPECT_FALSE(f.exact);
  EXPECT_EQ(f.key, (remat::PlanCache::Key{4, 64}));
  EXPECT_EQ(f.hints->source, "4x64");
  f = cache.find({batch, 32}, remat::PlanCache::Reuse::kNoLarger);
  EXPECT_EQ(f.hints, nullptr);  // only larger plans: record this step, plan it, insert
  if (f.hints == nullptr) cache.insert({batch, 32}, h);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.find({batch, 32}, remat::PlanCache::Reuse::kNoLarger).exact);
}

TEST(HeaderExamples, Planner) {
  const remat::Graph g = linear_graph(4);  // 9 unit nodes; no remat peaks at 6
  remat::PlanOptions opt;
  opt.budget_bytes = 4;  // or leave empty: the planner's own default
  opt.time_limit_seconds = 30;
  absl::StatusOr<remat::Plan> p = remat::run_planner("checkmate", g, opt);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->feasible) << p->reason;  // p->sim is the simulator's verdict
  EXPECT_TRUE(p->sim.valid);
  EXPECT_LE(p->sim.peak_bytes, 4);
  EXPECT_DOUBLE_EQ(p->sim.cost, 11);  // Checkmate's optimum for gen_linear_graph(4) at 4
  const remat::SimResult again = remat::simulate(g, p->schedule, opt.budget_bytes);
  EXPECT_TRUE(again.valid) << again.error;
  EXPECT_DOUBLE_EQ(again.cost, p->sim.cost);
}

TEST(HeaderExamples, Replay) {
  const std::string path = shared_file("traces/dtr/resnet32.log");
  if (path.empty()) GTEST_SKIP() << "no ../shared/traces/dtr/resnet32.log";
  auto trace = remat::read_dtr_trace_file(path).value();
  remat::ReplayOptions opts;
  opts.policy = "dtr";
  opts.budget = remat::replay_baseline(trace).logical_peak_bytes / 2;
  remat::ReplayResult r = remat::replay(trace, opts);  // r.slowdown, r.evictions, ...
  EXPECT_EQ(r.status, "ok") << r.error;
  EXPECT_GT(r.evictions, 0u);
  EXPECT_GE(r.slowdown, 1.0);
  EXPECT_LT(r.slowdown, 2.0);  // docs/formats.md: h_DTR runs resnet32 at 0.5 with slowdown 1.11
  EXPECT_LE(r.peak_allocated_bytes, opts.budget);
}

TEST(HeaderExamples, Runtime) {
  // The budget holds about 60 of the 64x64 results below, of which the program keeps 100.
  remat::Runtime rt({.backend = remat::Backend::kCpu, .budget = size_t{1} << 20, .policy = "dtr"});
  constexpr int n = 64;
  std::vector<float> weights(n * n, 0.0f);  // a cyclic shift of the columns
  for (int i = 0; i < n; ++i) weights[static_cast<std::size_t>(i * n + (i + 1) % n)] = 1.0f;
  const std::vector<float> xv = remat::testing::iota(n * n, 0.0f);
  const remat::OpPtr matmul = matmul_op();
  remat::Tensor x = rt.constant({{n, n}}, xv.data());
  remat::Tensor w = rt.constant({{n, n}}, weights.data());  // pinned
  std::vector<remat::Tensor> hs;
  for (int k = 0; k < 100; ++k) {
    remat::Tensor h = rt.call1(matmul, {hs.empty() ? x : hs.back(), w});  // may be evicted later
    hs.push_back(h);
  }
  EXPECT_GT(rt.stats().evictions, 0u);
  EXPECT_LE(rt.stats().memory.peak_reserved, rt.budget());
  for (int k : {0, 1, 49, 99}) {
    const remat::Tensor& h = hs[static_cast<std::size_t>(k)];
    std::vector<float> out(h.spec().numel());
    rt.read(h, out.data());  // recomputed if it was evicted
    // h_k = x shifted k + 1 columns to the right.
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < n; ++c)
        ASSERT_EQ(out[static_cast<std::size_t>(r * n + c)],
                  xv[static_cast<std::size_t>(r * n + ((c - (k + 1)) % n + n) % n)])
            << "h" << k << "[" << r << "][" << c << "]";
  }
  EXPECT_GT(rt.stats().recomputations, 0u);
}

TEST(HeaderExamples, ByteSize) {
  absl::StatusOr<std::uint64_t> b = remat::parse_byte_size("1.5GiB");  // 1610612736
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, 1610612736u);
  std::string s = remat::format_byte_size(*b);  // "1.50 GiB"
  EXPECT_EQ(s, "1.50 GiB");
  EXPECT_FALSE(remat::parse_byte_size("1.5 parsecs").ok());
}

// The loop of step_driver.h's example: a linear classifier over 64 inputs whose batch
// alternates between 256 and 192 rows.
class Loop : public remat::TrainingProgram {
 public:
  struct Weights : State {
    remat::Tensor w, m, v;
    float loss = 0;
  };
  std::unique_ptr<State> make_state(remat::Runtime& rt) override {
    const bool runs = rt.options().backend != remat::Backend::kSimulated;
    const std::vector<float> init(4 * 64, 0.01f), none(4 * 64, 0.0f);
    const float* w0 = runs ? init.data() : nullptr;
    const float* zeros = runs ? none.data() : nullptr;
    auto s = std::make_unique<Weights>();
    s->w = rt.constant({{4, 64}}, w0);  // data: null on the simulated backend
    s->m = rt.constant({{4, 64}}, zeros);
    s->v = rt.constant({{4, 64}}, zeros);
    return s;
  }
  void run_step(remat::Runtime& rt, State& state, int step) override {
    auto& s = static_cast<Weights&>(state);
    remat::ad::Tape tape(rt);
    remat::ad::Var w = tape.leaf(s.w);
    const std::vector<float> xs = remat::testing::iota(batch(step) * 64, 0.001f * step);
    const float* inputs = rt.options().backend != remat::Backend::kSimulated ? xs.data() : nullptr;
    remat::ad::Var x = tape.input(rt.constant({{batch(step), 64}}, inputs));
    remat::ad::Var loss = my_loss(tape, x, w, step);
    rt.mark_backward();
    tape.backward(loss);
    remat::read_back(rt, loss.value, &s.loss);  // read(); materialize() when simulated
    remat::ops::adamw(rt, s.w, s.m, s.v, tape.grad(w), {}, step + 1);
  }  // the step's tensors go here
  remat::PlanCache::Key shape_key(int step) const override { return {batch(step)}; }
  static std::int64_t batch(int step) { return step % 2 == 0 ? 256 : 192; }

 private:
  static remat::ad::Var my_loss(remat::ad::Tape& tape, const remat::ad::Var& x,
                                const remat::ad::Var& w, int step) {
    remat::Runtime& rt = tape.rt();
    std::vector<std::int32_t> labels(static_cast<std::size_t>(batch(step)));
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 4);
    const bool runs = rt.options().backend != remat::Backend::kSimulated;
    remat::Tensor y =
        rt.constant({{batch(step)}, remat::DType::kI32}, runs ? labels.data() : nullptr);
    return remat::ad::cross_entropy_mean(tape, remat::ad::linear(tape, x, w, remat::ad::Var{}), y);
  }
};

TEST(HeaderExamples, StepDriver) {
  Loop loop;
  remat::StepDriverOptions options;
  options.runtime.budget = std::size_t{256} << 20;  // policy "auto" by default
  options.plan_time_limit = 1;
  remat::StepDriver driver(loop, options);
  for (int step = 0; step < 6; ++step) {
    const remat::StepReport& r = driver.run(step);  // r.kind, r.overhead(), ...
    EXPECT_EQ(r.step, step);
    EXPECT_EQ(r.overhead(), 0.0) << "nothing to recompute under 256 MiB";
  }
  std::puts(driver.runtime().stats().summary().c_str());
  const std::vector<remat::ShapeReport> shapes = driver.shapes();
  ASSERT_EQ(shapes.size(), 2u);
  for (const remat::ShapeReport& s : shapes) EXPECT_EQ(s.steps, 3);  // plan, decision, seconds
  EXPECT_TRUE(std::isfinite(static_cast<Loop::Weights&>(driver.state()).loss));
}

TEST(HeaderExamples, Schedule) {
  // 0 (an input) -> 1 -> 2, and 3 reads 1 and 2.
  remat::Graph g;
  g.name = "diamond";
  g.nodes = {make_node(0, 100, 0, {}, remat::Phase::kForward, remat::NodeKind::kInput),
             make_node(1, 1000, 2, {0}, remat::Phase::kForward),
             make_node(2, 10, 1, {1}, remat::Phase::kForward),
             make_node(3, 10, 1, {1, 2}, remat::Phase::kBackward)};
  ASSERT_TRUE(remat::validate_graph(g).ok());
  remat::Schedule s{.graph = g.name, .order = {0, 1, 2, 1, 3}};  // node 1 recomputed
  remat::SimResult r = remat::simulate(g, s, /*budget_bytes=*/1 << 20);
  if (!r.valid) std::cerr << r.error << "\n";
  std::cout << r.peak_bytes << " " << r.cost << " " << r.overhead << "\n";
  EXPECT_TRUE(r.valid) << r.error;
  EXPECT_EQ(r.recomputations, 1);
  EXPECT_DOUBLE_EQ(r.cost, 6);        // 0 + 2 + 1 + 2 + 1
  EXPECT_DOUBLE_EQ(r.overhead, 0.5);  // 6 / 4 - 1
  EXPECT_EQ(r.peak_bytes, 1110);
  EXPECT_FALSE(remat::simulate(g, s, /*budget_bytes=*/1000).valid);  // over the budget
}

TEST(HeaderExamples, SegmentSource) {
  auto host = std::make_unique<remat::HostSegmentSource>();      // real host memory
  auto sim = std::make_unique<remat::SimulatedSegmentSource>();  // addresses only
  EXPECT_TRUE(host->host_accessible());
  EXPECT_FALSE(sim->host_accessible());
  void* seg = host->reserve(4096);
  ASSERT_NE(seg, nullptr);
  static_cast<char*>(seg)[4095] = 7;
  host->release(seg, 4096);
  remat::CachingAllocator alloc(std::move(sim), {.budget = 1 << 30});
  EXPECT_STREQ(alloc.source().name(), "simulated");
  void* p = alloc.allocate(size_t{3} << 20);
  EXPECT_NE(p, nullptr);
  EXPECT_GE(alloc.stats().reserved, size_t{3} << 20);
  alloc.deallocate(p, size_t{3} << 20);
  // `reserve` returns nullptr when the source itself is out of memory.
  remat::SimulatedSegmentSource small(1 << 20);
  EXPECT_EQ(small.reserve(size_t{2} << 20), nullptr);
}

TEST(HeaderExamples, StaticReplay) {
  const std::string path = shared_file("graphs/mlp16.json");
  if (path.empty()) GTEST_SKIP() << "no ../shared/graphs/mlp16.json";
  remat::PlanOptions opt;
  remat::Graph g = remat::hold_inputs(remat::read_graph_file(path).value());
  remat::Plan plan = remat::run_planner("twremat", g, opt).value();
  ASSERT_TRUE(plan.feasible) << plan.reason;
  auto r = remat::static_replay(g, plan.schedule, {.accounting = remat::Accounting::kAllocator});
  ASSERT_TRUE(r.ok()) << r.status();
  if (r.ok())
    std::cout << r->peak_reserved_bytes - plan.sim.peak_bytes << "\n";  // allocator's share
  // The allocator rounds every tensor up (to 512 bytes) and reserves whole segments.
  EXPECT_GE(static_cast<int64_t>(r->peak_allocated_bytes), plan.sim.peak_bytes);
  EXPECT_GE(r->peak_reserved_bytes, r->peak_allocated_bytes);
  EXPECT_EQ(static_cast<int>(r->recomputations), plan.sim.recomputations);
  EXPECT_NEAR(r->overhead, plan.sim.overhead, 1e-9);
  // Counted logically, each node is its own tensor as simulate() counts them: the same peak.
  auto logical =
      remat::static_replay(g, plan.schedule, {.accounting = remat::Accounting::kLogical});
  ASSERT_TRUE(logical.ok()) << logical.status();
  EXPECT_EQ(static_cast<int64_t>(logical->peak_allocated_bytes), plan.sim.peak_bytes);
  EXPECT_EQ(logical->peak_reserved_bytes, logical->peak_allocated_bytes);
}

TEST(HeaderExamples, StepPlanner) {
  const std::vector<float> wv = remat::testing::iota(64, 0.25f),
                           xv = remat::testing::iota(64, -3.0f);
  // The value the step computes and its peak, with no budget.
  const Unconstrained plain = run_unconstrained(wv, xv, 8, remat::Accounting::kLogical);
  const float expected = plain.value;
  const std::size_t peak = plain.peak;
  // Under two thirds of that peak, counted as the planners count it.
  const std::size_t budget = peak * 2 / 3;
  remat::Runtime rt({.backend = remat::Backend::kCpu,
                     .accounting = remat::Accounting::kLogical,
                     .budget = budget,
                     .policy = "hinted"});
  remat::Tensor w = rt.constant(remat::testing::vec(64), wv.data());
  remat::Tensor x = rt.constant(remat::testing::vec(64), xv.data());
  remat::PlanCache cache;
  const remat::PlanCache::Key key = {1, 64};
  remat::StepOptions so;
  so.record = true;
  rt.begin_step(so);
  EXPECT_EQ(run_step(rt, w, x, 8), expected);
  remat::RecordedStep step = rt.end_step();  // recorded with StepOptions::record
  EXPECT_GT(rt.stats().recomputations, 0u);  // DTR alone had to recompute

  remat::StepPlanOptions opt;
  opt.budget_bytes = static_cast<int64_t>(budget);  // the planners' budget
  opt.planners = {"chen", "twremat", "rotor"};
  absl::StatusOr<remat::ChosenPlan> chosen = remat::plan_step(step.graph, step.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  if (chosen.ok() && chosen->feasible)
    cache.insert(key, std::make_shared<remat::StepHints>(chosen->hints));
  else if (chosen.ok())
    std::cerr << chosen->reason << "\n";  // nothing fits the budget
  ASSERT_TRUE(chosen->feasible) << chosen->reason;
  ASSERT_EQ(chosen->candidates.size(), 4u);  // the realized schedule, then the three planners
  EXPECT_EQ(chosen->candidates[0].source, "the schedule the runtime realized");
  for (const remat::StepCandidate& c : chosen->candidates)
    if (c.feasible) {
      EXPECT_GE(c.cost, chosen->sim.cost) << c.source;
    }
  EXPECT_TRUE(chosen->sim.valid) << chosen->sim.error;
  EXPECT_EQ(chosen->hints.source, chosen->source);
  EXPECT_FALSE(chosen->hints.ops.empty());

  // The next step follows the plan and computes the same value within the budget.
  so.record = false;
  so.hints = cache.find(key).hints;
  ASSERT_NE(so.hints, nullptr);
  rt.begin_step(so);
  EXPECT_EQ(run_step(rt, w, x, 8), expected);
  rt.end_step();
  EXPECT_EQ(rt.stats().hint_mismatches, 0u);
  EXPECT_LE(rt.stats().memory.peak_allocated, budget);

  // A budget below what any schedule needs is no error: no plan, each candidate's reason.
  opt.budget_bytes = 1;
  opt.include_realized = false;  // (it already ran, so it is not held to budget_bytes)
  chosen = remat::plan_step(step.graph, step.executed, opt);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_FALSE(chosen->feasible);
  EXPECT_NE(chosen->reason.find("twremat"), std::string::npos) << chosen->reason;
  EXPECT_TRUE(chosen->hints.ops.empty());
}

TEST(HeaderExamples, Tensor) {
  remat::Runtime rt({.backend = remat::Backend::kCpu});
  const auto relu = relu_op();
  const std::vector<float> host_data = {-2, -1, 0, 1, 2, 3, -4, 5, 6, -7, 8, 9, 10, -11, 12, 13,
                                        -2, -1, 0, 1, 2, 3, -4, 5, 6, -7, 8, 9, 10, -11, 12, 13};
  remat::TensorSpec spec{{4, 8}, remat::DType::kF32};     // shape and dtype, always known
  remat::Tensor x = rt.constant(spec, host_data.data());  // pinned, never evicted
  remat::Tensor y = rt.call1(relu, {x});                  // y's memory may be evicted...
  EXPECT_EQ(y.spec(), spec);
  EXPECT_EQ(y.bytes(), 4u * 8u * sizeof(float));
  EXPECT_FALSE(rt.evict(x));
  ASSERT_TRUE(rt.evict(y));
  EXPECT_FALSE(y.resident());
  const float* p = rt.data<float>(y);  // ...and is recomputed on access
  EXPECT_TRUE(y.resident());
  for (std::size_t i = 0; i < host_data.size(); ++i)
    EXPECT_EQ(p[i], host_data[i] > 0 ? host_data[i] : 0.0f) << i;
  EXPECT_EQ(rt.stats().recomputations, 1u);
}

TEST(HeaderExamples, Timeline) {
  remat::Runtime rt({.backend = remat::Backend::kSimulated, .record_timeline = true});
  remat::Tensor w = rt.constant(remat::testing::vec(256));
  remat::Tensor x = rt.constant(remat::testing::vec(256));
  rt.begin_step();
  run_step(rt, w, x, 4);  // a step of 10 ops
  rt.end_step();
  ASSERT_EQ(rt.timeline().events.size(), rt.stats().calls);
  EXPECT_EQ(rt.timeline().memory.size(), rt.timeline().events.size());
  const std::string file = ::testing::TempDir() + "step.trace.json";
  {
    std::ofstream out(file);
    absl::Status s = remat::write_timeline_file(rt.timeline(), "gpt step 0 @ 0.5", out);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.str().find("gpt step 0 @ 0.5"), std::string::npos);
  EXPECT_NE(text.str().find("\"combine\""), std::string::npos);
  std::filesystem::remove(file);
}

}  // namespace
