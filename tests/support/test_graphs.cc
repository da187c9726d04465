#include "tests/support/test_graphs.h"

#include <absl/strings/str_cat.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "remat/schedule.h"

namespace remat::testing {

std::string shared_graphs_dir() {
  std::filesystem::path p = std::filesystem::path(REMAT_SHARED_DIR) / "graphs";
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return p.string();
  return "";
}

static Node make_node(int id, int64_t bytes, double cost, std::vector<int> inputs, Phase ph) {
  Node n;
  n.id = id;
  n.name = absl::StrCat("n", id);
  n.op = "op";
  n.bytes = bytes;
  n.cost = cost;
  n.inputs = std::move(inputs);
  n.phase = ph;
  return n;
}

Graph linear_graph(int n) {
  Graph g;
  g.name = absl::StrCat("linear", n);
  for (int i = 0; i <= 2 * n; ++i) {
    std::vector<int> in;
    if (i > 0) in.push_back(i - 1);
    if (i > n) in.push_back(2 * n - i);  // edge (2n - i) -> i
    g.nodes.push_back(make_node(i, 1, 1, in, i <= n ? Phase::kForward : Phase::kBackward));
  }
  g.outputs = {2 * n};
  return g;
}

Graph diamond_graph() {
  Graph g = random_dag(4, 0, 1, 1);
  for (Node& n : g.nodes) {
    n.bytes = 1;
    n.cost = 1;
    n.inputs.clear();
  }
  g.nodes[0].bytes = 100;
  g.nodes[0].cost = 7;
  g.nodes[1].inputs = {0};
  g.nodes[2].inputs = {1};
  g.nodes[3].inputs = {0, 2};
  return g;
}

Graph random_dag(int n, double p, int max_bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> b(1, max_bytes), c(1, 5);
  Graph g;
  g.name = absl::StrCat("random", seed);
  for (int i = 0; i < n; ++i) {
    std::vector<int> in;
    for (int j = 0; j < i; ++j)
      if (u(rng) < p || (j == i - 1 && u(rng) < 0.5)) in.push_back(j);
    g.nodes.push_back(make_node(i, b(rng), c(rng), in, Phase::kForward));
  }
  return g;
}

Graph random_training_graph(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> b(1, 4), c(1, 5);
  Graph g;
  g.name = absl::StrCat("train", seed);
  for (int i = 0; i < n; ++i) {
    std::vector<int> in;
    if (i > 0) in.push_back(i - 1);
    if (i > 1 && rng() % 3 == 0) in.push_back(i - 2);
    g.nodes.push_back(make_node(i, b(rng), c(rng), in, Phase::kForward));
  }
  for (int k = 0; k < n; ++k) {
    int id = n + k;
    std::vector<int> in = {id - 1, n - 1 - k};
    g.nodes.push_back(make_node(id, b(rng), c(rng), in, Phase::kBackward));
  }
  return g;
}

namespace {

// Builds dense_net_graph: the forward pass op by op, remembering what each op's backward
// reads, then the backward pass in reverse with gradients accumulated as autograd does
// (a value read by several ops gets one add per extra gradient contribution).
class DenseNetBuilder {
 public:
  explicit DenseNetBuilder(uint64_t seed) : rng_(seed) {}

  Graph build(const std::vector<int>& block_layers) {
    g_.name = "densenet";
    // StrCat rather than "_" + std::to_string: GCC 12 raises a false -Wrestrict at -O3.
    for (int l : block_layers) absl::StrAppend(&g_.name, "_", l);
    forward(block_layers);
    backward();
    return std::move(g_);
  }

 private:
  enum class Op { kCat, kBatchNorm, kRelu, kConv, kPool, kLinear, kLoss };
  struct FwdOp {
    int id;
    Op op;
    std::vector<int> inputs;  // values (compute nodes or the data input)
    int param;                // parameter node or -1
  };
  struct Value {
    int id;
    int channels;
    int spatial;  // height * width
  };

  static constexpr int kBatch = 8, kGrowth = 32;

  int64_t bytes(int channels, int spatial) const {
    return static_cast<int64_t>(4) * kBatch * channels * spatial;
  }
  double jitter() { return std::uniform_real_distribution<double>(0.8, 1.25)(rng_); }

  int add(const std::string& op, NodeKind kind, Phase ph, int64_t bytes, double cost,
          std::vector<int> inputs) {
    Node n = make_node(g_.size(), std::max<int64_t>(1, std::llround(bytes * jitter())),
                       kind == NodeKind::kCompute ? cost * jitter() : 0, std::move(inputs), ph);
    n.op = op;
    n.kind = kind;
    g_.nodes.push_back(n);
    return n.id;
  }
  int param(int64_t bytes) {
    return add("placeholder", NodeKind::kInput, Phase::kForward, bytes, 0, {});
  }
  // A forward op: records what its backward needs.
  Value fwd(Op op, const std::string& name, std::vector<int> in, int param, int channels,
            int spatial, double cost) {
    int id = add(name, NodeKind::kCompute, Phase::kForward, bytes(channels, spatial), cost, in);
    if (param >= 0) g_.nodes[id].inputs.push_back(param);
    fwd_.push_back({id, op, std::move(in), param});
    return {id, channels, spatial};
  }
  Value elementwise(Op op, const std::string& name, Value x, int param = -1) {
    return fwd(op, name, {x.id}, param, x.channels, x.spatial,
               static_cast<double>(bytes(x.channels, x.spatial)) / 100);
  }
  Value bn_relu(Value x) {
    int p = param(bytes(2 * x.channels, 1) / kBatch);
    return elementwise(Op::kRelu, "aten.relu",
                       elementwise(Op::kBatchNorm, "aten.native_batch_norm", x, p));
  }
  Value conv(Value x, int out_channels, int kernel, int stride) {
    int w = param(bytes(x.channels * out_channels * kernel * kernel, 1) / kBatch);
    int spatial = x.spatial / (stride * stride);
    double flops = 2.0 * kBatch * spatial * x.channels * out_channels * kernel * kernel;
    return fwd(Op::kConv, "aten.convolution", {x.id}, w, out_channels, spatial, flops / 1e5);
  }
  Value cat(const std::vector<Value>& xs) {
    std::vector<int> ids;
    int channels = 0;
    for (const Value& x : xs) {
      ids.push_back(x.id);
      channels += x.channels;
    }
    return fwd(Op::kCat, "aten.cat", ids, -1, channels, xs[0].spatial,
               static_cast<double>(bytes(channels, xs[0].spatial)) / 100);
  }
  Value pool(Value x, int stride) {
    return fwd(Op::kPool, "aten.avg_pool2d", {x.id}, -1, x.channels, x.spatial / (stride * stride),
               static_cast<double>(bytes(x.channels, x.spatial)) / 100);
  }

  // Every layer of a dense block reads the concatenation of all earlier outputs.
  Value dense_block(Value x, int layers) {
    std::vector<Value> features = {x};
    for (int l = 0; l < layers; ++l) {
      Value h = conv(bn_relu(cat(features)), 4 * kGrowth, 1, 1);
      features.push_back(conv(bn_relu(h), kGrowth, 3, 1));
    }
    return cat(features);
  }

  void forward(const std::vector<int>& block_layers) {
    Value x{add("placeholder", NodeKind::kInput, Phase::kForward, bytes(3, 128 * 128), 0, {}), 3,
            128 * 128};
    x = pool(bn_relu(conv(x, 2 * kGrowth, 7, 2)), 2);
    for (size_t b = 0; b < block_layers.size(); ++b) {
      x = dense_block(x, block_layers[b]);
      if (b + 1 < block_layers.size()) x = pool(conv(bn_relu(x), x.channels / 2, 1, 1), 2);
    }
    x = pool(bn_relu(x), static_cast<int>(std::lround(std::sqrt(x.spatial))));
    int w = param(bytes(x.channels * 1000, 1) / kBatch);
    x = fwd(Op::kLinear, "aten.addmm", {x.id}, w, 1000, 1, 2.0 * kBatch * x.channels * 1000 / 1e5);
    int labels = add("placeholder", NodeKind::kInput, Phase::kForward, 8 * kBatch, 0, {});
    Value loss = fwd(Op::kLoss, "aten.nll_loss_forward", {x.id}, labels, 1, 1, 100);
    g_.outputs.push_back(loss.id);
  }

  // Adds a gradient contribution to value v (nothing for inputs).
  void contribute(int v, int grad) {
    if (g_.nodes[v].kind != NodeKind::kCompute) return;
    auto [it, fresh] = grad_.try_emplace(v, grad);
    if (!fresh) it->second = grad_node("aten.add", v, {it->second, grad});
  }
  int grad_node(const std::string& op, int v, std::vector<int> in, double cost_factor = 1) {
    const Node& f = g_.nodes[v];
    return add(op, NodeKind::kCompute, Phase::kBackward, f.bytes,
               std::max(f.cost, static_cast<double>(f.bytes) / 100) * cost_factor, std::move(in));
  }

  void backward() {
    int tangent = add("placeholder", NodeKind::kTangent, Phase::kBackward, 4, 0, {});
    grad_[fwd_.back().id] = tangent;
    for (auto it = fwd_.rbegin(); it != fwd_.rend(); ++it) {
      auto found = grad_.find(it->id);
      if (found == grad_.end()) continue;  // nothing reads it
      int dy = found->second;
      if (it->op == Op::kCat) {
        for (int x : it->inputs)  // each input's share of the gradient is a slice of it
          contribute(
              x, add("aten.slice", NodeKind::kView, Phase::kBackward, g_.nodes[x].bytes, 0, {dy}));
        continue;
      }
      int x = it->inputs[0];
      std::vector<int> reads = {dy, it->op == Op::kRelu ? it->id : x};
      if (it->param >= 0) reads.push_back(it->param);
      if (it->param >= 0 && it->op != Op::kLoss)  // the parameter's gradient: an output
        add("aten.param_backward", NodeKind::kCompute, Phase::kBackward, g_.nodes[it->param].bytes,
            g_.nodes[it->id].cost, reads);
      if (g_.nodes[x].kind == NodeKind::kCompute)
        contribute(x, grad_node(backward_name(it->op), x, reads, it->op == Op::kConv ? 1.0 : 0.5));
    }
  }

  static const char* backward_name(Op op) {
    switch (op) {
      case Op::kBatchNorm:
        return "aten.native_batch_norm_backward";
      case Op::kRelu:
        return "aten.threshold_backward";
      case Op::kConv:
        return "aten.convolution_backward";
      case Op::kPool:
        return "aten.avg_pool2d_backward";
      case Op::kLinear:
        return "aten.mm";
      case Op::kLoss:
        return "aten.nll_loss_backward";
      case Op::kCat:
        break;
    }
    return "aten.slice";
  }

  std::mt19937_64 rng_;
  Graph g_;
  std::vector<FwdOp> fwd_;
  std::map<int, int> grad_;  // forward value -> its gradient accumulated so far
};

}  // namespace

Graph dense_net_graph(const std::vector<int>& block_layers, uint64_t seed) {
  return DenseNetBuilder(seed).build(block_layers);
}

std::vector<Offload> random_offloads(const Graph& g, const std::vector<int>& order, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int>> touches(order.size());  // per instance: its step, its reads
  std::vector<int> latest(static_cast<size_t>(g.size()), -1);
  for (size_t j = 0; j < order.size(); ++j) {
    touches[j].push_back(static_cast<int>(j));
    for (int u : g.nodes[static_cast<size_t>(order[j])].inputs)
      if (touches[static_cast<size_t>(latest[u])].back() != static_cast<int>(j))
        touches[static_cast<size_t>(latest[u])].push_back(static_cast<int>(j));
    latest[static_cast<size_t>(order[j])] = static_cast<int>(j);
  }
  std::vector<Offload> out;
  for (size_t i = 0; i < order.size(); ++i) {
    const std::vector<int>& t = touches[i];
    if (t.size() < 2 || rng() % 2) continue;
    const size_t a = rng() % (t.size() - 1);
    if (t[a + 1] - t[a] < 2) continue;
    const int free =
        t[a] + 1 + static_cast<int>(rng() % static_cast<uint64_t>(t[a + 1] - t[a] - 1));
    const int fetch = free + 1 + static_cast<int>(rng() % static_cast<uint64_t>(t[a + 1] - free));
    out.push_back({static_cast<int>(i), free, fetch});
  }
  return out;
}

}  // namespace remat::testing
