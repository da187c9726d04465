#include "examples/treelstm_model.h"

#include <cmath>

#include "examples/common/random.h"

namespace remat::examples {

void TreeLstmModel::add_flags(cli::FlagSet& flags) {
  flags.add("trees", &c_.trees, "trees per step", 1);
  flags.add("hidden", &c_.hidden, "hidden state width", 1);
  flags.add("vocab", &c_.vocab, "vocabulary size", 2);
  flags.add("classes", &c_.classes, "output classes", 2);
  flags.add("min-leaves", &c_.min_leaves, "fewest leaves a tree draws", 1);
  flags.add("max-leaves", &c_.max_leaves, "most leaves a tree draws", 1);
}

absl::Status TreeLstmModel::check_flags() const {
  if (c_.min_leaves > c_.max_leaves)
    return absl::InvalidArgumentError("--min-leaves must be at most --max-leaves");
  return absl::OkStatus();
}

std::vector<HostTensor> TreeLstmModel::init_params(std::uint64_t seed) const {
  SplitMix rng(seed, 0x72EE);
  const std::int64_t H = c_.hidden;
  const float s = 1.0f / std::sqrt(static_cast<float>(2 * H));
  return {
      {"embed", TensorSpec{{c_.vocab, H}, DType::kF32}, normal_values(c_.vocab * H, 0.5f, rng)},
      {"gates_w", TensorSpec{{5 * H, 2 * H}, DType::kF32}, normal_values(10 * H * H, s, rng)},
      {"gates_b", TensorSpec{{5 * H}, DType::kF32}, constant_values(5 * H, 0.0f)},
      {"out_w", TensorSpec{{c_.classes, H}, DType::kF32},
       normal_values(c_.classes * H, 1.0f / std::sqrt(static_cast<float>(H)), rng)},
      {"out_b", TensorSpec{{c_.classes}, DType::kF32}, constant_values(c_.classes, 0.0f)},
  };
}

namespace {
struct State {
  ad::Var h, c;
};
}  // namespace

// One draw of the step's data stream, in the order the trees are built: every tree's leaf
// count and tokens, then every tree's merges.
StepTrees TreeLstmModel::trees(int step, std::uint64_t seed) const {
  SplitMix data(seed, 0x78EE + static_cast<std::uint64_t>(step));
  StepTrees t;
  t.leaves.resize(static_cast<std::size_t>(c_.trees));
  for (auto& tokens : t.leaves) {
    const std::int64_t n =
        c_.min_leaves + static_cast<std::int64_t>(data.below(
                            static_cast<std::uint64_t>(c_.max_leaves - c_.min_leaves + 1)));
    std::int64_t sum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      tokens.push_back(static_cast<std::int32_t>(data.below(static_cast<std::uint64_t>(c_.vocab))));
      sum += tokens.back() * (i % 2 == 0 ? 1 : 2);
    }
    t.labels.push_back(static_cast<std::int32_t>(sum % c_.classes));
  }
  for (const auto& tokens : t.leaves) {
    std::vector<std::size_t>& merges = t.merges.emplace_back();
    for (std::size_t size = tokens.size(); size > 1; --size) merges.push_back(data.below(size - 1));
  }
  return t;
}

// The trees' shapes: how many leaves, and a 64-bit hash of each tree's leaf count and merge
// positions (the structure itself would make a key of hundreds of numbers per step, kept for
// every shape seen). Steps with equal keys run the same ops at the same shapes; with random
// trees, keys seldom repeat, and a shape never seen twice is never recorded or planned.
PlanCache::Key TreeLstmModel::shape_key(int step, std::uint64_t seed) const {
  const StepTrees t = trees(step, seed);
  std::uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a over the structure
  std::int64_t leaves = 0;
  auto mix = [&](std::uint64_t x) { hash = (hash ^ x) * 0x100000001b3ULL; };
  for (std::size_t i = 0; i < t.leaves.size(); ++i) {
    leaves += static_cast<std::int64_t>(t.leaves[i].size());
    mix(t.leaves[i].size());
    for (std::size_t k : t.merges[i]) mix(k);
  }
  return {static_cast<std::int64_t>(t.leaves.size()), leaves, static_cast<std::int64_t>(hash)};
}

ad::Var TreeLstmModel::loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                            const std::vector<Tensor>&, int step, std::uint64_t seed) {
  Runtime& rt = tape.rt();
  const std::int64_t H = c_.hidden;
  const ad::Var& embed = params[0];
  const ad::Var& gw = params[1];
  const ad::Var& gb = params[2];
  const bool runs = rt.options().backend != Backend::kSimulated;
  const StepTrees t = trees(step, seed);

  // Every tree's leaves first: one embedding lookup for the whole step.
  std::vector<std::int32_t> all_tokens;
  for (const auto& tokens : t.leaves)
    all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
  const auto total = static_cast<std::int64_t>(all_tokens.size());
  Tensor idx = rt.constant(TensorSpec{{1, total}, DType::kI32}, runs ? all_tokens.data() : nullptr);
  Tensor tgt = rt.constant(TensorSpec{{c_.trees}, DType::kI32}, runs ? t.labels.data() : nullptr);
  ad::Var emb = ad::embedding(tape, idx, embed, ad::Var{});  // (1, total, H)

  std::int64_t leaf_base = 0;
  std::vector<ad::Var> roots;
  for (std::size_t tree = 0; tree < t.leaves.size(); ++tree) {
    // Leaves in order; then merge random adjacent pairs until one root is left, so every
    // tree has its own shape.
    const std::vector<std::int32_t>& tokens = t.leaves[tree];
    std::vector<State> level;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      ad::Var c = ad::narrow(tape, emb, (leaf_base + static_cast<std::int64_t>(i)) * H, {1, H});
      level.push_back({ad::tanh(tape, c), c});
    }
    leaf_base += static_cast<std::int64_t>(tokens.size());
    for (const std::size_t k : t.merges[tree]) {
      const State& l = level[k];
      const State& r = level[k + 1];
      ad::Var in = ad::reshape(tape, ad::concat(tape, {l.h, r.h}), {1, 2 * H});
      ad::Var gates = ad::linear(tape, in, gw, gb);  // (1, 5H): i, f_l, f_r, o, u
      auto gate = [&](int g) { return ad::narrow(tape, gates, g * H, {1, H}); };
      ad::Var i = ad::sigmoid(tape, gate(0));
      ad::Var fl = ad::sigmoid(tape, gate(1));
      ad::Var fr = ad::sigmoid(tape, gate(2));
      ad::Var o = ad::sigmoid(tape, gate(3));
      ad::Var u = ad::tanh(tape, gate(4));
      ad::Var c = ad::add(tape, ad::add(tape, ad::mul(tape, i, u), ad::mul(tape, fl, l.c)),
                          ad::mul(tape, fr, r.c));
      ad::Var h = ad::mul(tape, o, ad::tanh(tape, c));
      level[k] = State{h, c};
      level.erase(level.begin() + static_cast<std::ptrdiff_t>(k) + 1);
    }
    roots.push_back(level[0].h);
  }
  ad::Var hs = ad::concat(tape, roots);  // (trees, H)
  ad::Var logits = ad::linear(tape, hs, params[3], params[4]);
  return ad::cross_entropy_mean(tape, logits, tgt);
}

}  // namespace remat::examples
