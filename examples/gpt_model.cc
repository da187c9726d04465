#include "examples/gpt_model.h"

#include <absl/strings/str_cat.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "examples/common/random.h"

namespace remat::examples {

namespace {
const char* const kWords[] = {
    "the",        "memory", "budget",  "tensor", "is",    "evicted", "and",   "later",
    "recomputed", "when",   "a",       "kernel", "reads", "it",      "again", "so",
    "training",   "fits",   "in",      "less",   "space", "than",    "its",   "activations",
    "need",       "while",  "results", "stay",   "exact", "to",      "the",   "bit"};
constexpr std::size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
}  // namespace

std::vector<std::int32_t> generated_text(std::uint64_t seed, std::uint64_t offset, std::int64_t n) {
  // A text made of sentences; position `offset` is reached by generating from the start of a
  // 4 KiB chunk, so any window is cheap to produce and the same on every call.
  constexpr std::uint64_t kChunk = 4096;
  std::vector<std::int32_t> out;
  out.reserve(static_cast<std::size_t>(n));
  std::uint64_t chunk = offset / kChunk;
  std::uint64_t skip = offset % kChunk;
  while (static_cast<std::int64_t>(out.size()) < n) {
    SplitMix rng(seed, 0x7E47 + chunk);
    std::string text;
    while (text.size() < kChunk) {
      const std::uint64_t words = 3 + rng.below(8);
      for (std::uint64_t w = 0; w < words; ++w) {
        std::string word = kWords[rng.below(kNumWords)];
        if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
        text += word;
        text += w + 1 == words ? ". " : " ";
      }
    }
    for (std::uint64_t i = skip; i < kChunk && static_cast<std::int64_t>(out.size()) < n; ++i)
      out.push_back(static_cast<unsigned char>(text[i]));
    skip = 0;
    ++chunk;
  }
  return out;
}

void GptModel::add_flags(cli::FlagSet& flags) {
  flags.add("layers", &c_.layers, "transformer blocks", 1);
  flags.add("channels", &c_.channels, "embedding width (a multiple of --heads)", 1);
  flags.add("heads", &c_.heads, "attention heads", 1);
  flags.add("vocab", &c_.vocab, "vocabulary size (the text is bytes)", 2);
  flags.add("batch", &c_.batch, "sequences per step", 1);
  flags.add("min-t", &c_.min_t, "shortest sequence a step draws", 1);
  flags.add("max-t", &c_.max_t, "longest sequence a step draws", 1);
  flags.add("dropout", &c_.dropout, "dropout probability, below 1", 0.0f);
}

absl::Status GptModel::check_flags() const {
  if (c_.channels % c_.heads != 0)
    return absl::InvalidArgumentError("--channels must be a multiple of --heads");
  if (c_.min_t > c_.max_t) return absl::InvalidArgumentError("--min-t must be at most --max-t");
  if (c_.dropout >= 1.0f) return absl::InvalidArgumentError("--dropout must be below 1");
  return absl::OkStatus();
}

std::vector<HostTensor> GptModel::init_params(std::uint64_t seed) const {
  const std::int64_t C = c_.channels, V = c_.vocab, L = c_.layers;
  SplitMix rng(seed, 0x6E7);
  std::vector<HostTensor> p;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, std::vector<float> data) {
    p.push_back(
        HostTensor{std::move(name), TensorSpec{std::move(shape), DType::kF32}, std::move(data)});
  };
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
  add("wte", {V, C}, normal_values(V * C, 0.02f, rng));
  add("wpe", {c_.max_t, C}, normal_values(c_.max_t * C, 0.01f, rng));
  for (std::int64_t l = 0; l < L; ++l) {
    add("ln1w", {C}, constant_values(C, 1.0f));
    add("ln1b", {C}, constant_values(C, 0.0f));
    add("qkvw", {3 * C, C}, normal_values(3 * C * C, 0.02f, rng));
    add("qkvb", {3 * C}, constant_values(3 * C, 0.0f));
    add("attprojw", {C, C}, normal_values(C * C, proj_std, rng));
    add("attprojb", {C}, constant_values(C, 0.0f));
    add("ln2w", {C}, constant_values(C, 1.0f));
    add("ln2b", {C}, constant_values(C, 0.0f));
    add("fcw", {4 * C, C}, normal_values(4 * C * C, 0.02f, rng));
    add("fcb", {4 * C}, constant_values(4 * C, 0.0f));
    add("fcprojw", {C, 4 * C}, normal_values(4 * C * C, proj_std, rng));
    add("fcprojb", {C}, constant_values(C, 0.0f));
  }
  add("lnfw", {C}, constant_values(C, 1.0f));
  add("lnfb", {C}, constant_values(C, 0.0f));
  return p;
}

std::int64_t GptModel::seq_len(int step, std::uint64_t seed) const {
  SplitMix rng(seed, 0x5E0 + static_cast<std::uint64_t>(step));
  return c_.min_t +
         static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(c_.max_t - c_.min_t + 1)));
}

double GptModel::items(int step, std::uint64_t seed) const {
  return static_cast<double>(c_.batch * seq_len(step, seed));
}

ad::Var GptModel::loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                       const std::vector<Tensor>& buffers, int step, std::uint64_t seed) {
  return shard_loss(tape, params, buffers, step, seed, {});
}

absl::Status GptModel::check_shards(int count) const {
  if (count >= 1 && c_.batch % count == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--batch ", c_.batch, " does not split into ", count, " equal shards"));
}

ad::Var GptModel::shard_loss(ad::Tape& tape, const std::vector<ad::Var>& params,
                             const std::vector<Tensor>&, int step, std::uint64_t seed,
                             Shard shard) {
  if (absl::Status st = check_shards(shard.count); !st.ok())
    throw std::invalid_argument(std::string(st.message()));
  Runtime& rt = tape.rt();
  const std::int64_t all = c_.batch, T = seq_len(step, seed), C = c_.channels;
  const std::int64_t B = all / shard.count, first = B * shard.index;
  // Inputs and next-token targets from the generated text, one window per batch row; the
  // shard's rows of the whole batch's.
  const std::vector<std::int32_t> text =
      generated_text(seed, static_cast<std::uint64_t>(step) * 7919 * all, all * (T + 1) + 1);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B * T)),
      targets(static_cast<std::size_t>(B * T));
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t t = 0; t < T; ++t) {
      const std::int32_t tok = text[static_cast<std::size_t>((first + b) * (T + 1) + t)];
      const std::int32_t next = text[static_cast<std::size_t>((first + b) * (T + 1) + t + 1)];
      inputs[static_cast<std::size_t>(b * T + t)] = tok % static_cast<std::int32_t>(c_.vocab);
      targets[static_cast<std::size_t>(b * T + t)] = next % static_cast<std::int32_t>(c_.vocab);
    }
  }
  const bool runs = rt.options().backend != Backend::kSimulated;
  Tensor idx = rt.constant(TensorSpec{{B, T}, DType::kI32}, runs ? inputs.data() : nullptr);
  Tensor tgt = rt.constant(TensorSpec{{B * T}, DType::kI32}, runs ? targets.data() : nullptr);

  std::size_t p = 0;
  const ad::Var& wte = params[p++];
  const ad::Var& wpe = params[p++];
  ad::Var x = ad::embedding(tape, idx, wte, wpe);
  for (std::int64_t l = 0; l < c_.layers; ++l) {
    const ad::Var* w = &params[p];
    p += 12;
    ad::Var h = ad::layernorm(tape, x, w[0], w[1]);
    h = ad::linear(tape, h, w[2], w[3]);
    h = ad::attention(tape, h, c_.heads);
    h = ad::linear(tape, h, w[4], w[5]);
    h = ad::dropout(tape, h, c_.dropout);
    x = ad::add(tape, x, h);
    h = ad::layernorm(tape, x, w[6], w[7]);
    h = ad::linear(tape, h, w[8], w[9]);
    h = ad::gelu(tape, h);
    h = ad::linear(tape, h, w[10], w[11]);
    h = ad::dropout(tape, h, c_.dropout);
    x = ad::add(tape, x, h);
  }
  x = ad::layernorm(tape, x, params[p], params[p + 1]);
  ad::Var logits = ad::linear(tape, ad::reshape(tape, x, {B * T, C}), wte, ad::Var{});
  return ad::cross_entropy_mean(tape, logits, tgt);
}

}  // namespace remat::examples
