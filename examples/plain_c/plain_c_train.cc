// The worked example of docs/integrating.md as a program: the plain-C loop on its own
// buffers, then the same kernels through remat under a budget, and whether they agree. The
// loop is the residual MLP (model.h) or, with --model gpt2, the GPT-2 (gpt2_model.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "examples/plain_c/gpt2_model.h"
#include "examples/plain_c/model.h"
#include "remat/byte_size.h"
#include "remat/errors.h"
#include "tools/cli/driver_flags.h"
#include "tools/cli/exit_code.h"

namespace {

// Trains `reference` on its own buffers and `loop` through remat for `steps` steps, the
// budget a fraction of the loop's unconstrained peak where `budget` says so, and prints
// whether they agree. Returns the exit status.
template <typename Reference, typename Loop>
int train_and_compare(const char* name, Reference& reference, Loop& loop,
                      remat::StepDriverOptions options, const remat::cli::BudgetFlags& budget,
                      int steps) {
  for (int s = 0; s < steps; ++s) reference.step(s);
  const std::size_t peak = remat::measure_unconstrained_peak(loop, options.runtime, steps);
  if (budget.fraction)
    options.runtime.budget = static_cast<std::size_t>(*budget.fraction * static_cast<double>(peak));
  try {
    remat::StepDriver driver(loop, options);
    for (int s = 0; s < steps; ++s) driver.run(s);
    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    const auto& losses = Loop::losses(driver.state());
    // Where kernels do not run (--backend sim) there are no losses or parameters to read:
    // the run says whether the budget held, and what it cost.
    const bool kernels_ran = options.runtime.backend != remat::Backend::kSimulated;
    bool same = kernels_ran && same_bits(losses, reference.losses());
    if (same) {
      const auto params = Loop::parameters(driver.runtime(), driver.state());
      for (std::size_t i = 0; same && i < params.size(); ++i)
        same = same_bits(params[i], reference.parameters()[i]);
    }
    const float final_loss = losses.empty() ? NAN : losses.back();
    std::printf("%s: %d steps, final loss %.6f; budget %s of unconstrained peak %s\n  %s\n", name,
                steps, static_cast<double>(final_loss),
                options.runtime.budget == SIZE_MAX
                    ? "none"
                    : remat::format_byte_size(options.runtime.budget).c_str(),
                remat::format_byte_size(peak).c_str(), driver.runtime().stats().summary().c_str());
    if (!kernels_ran) {
      std::printf("  the simulated backend runs no kernels: nothing to compare\n");
      return remat::cli::kExitOk;
    }
    std::printf("  losses and parameters match the plain-C loop bit for bit: %s\n",
                same ? "yes" : "no");
    return same ? remat::cli::kExitOk : remat::cli::kExitInfeasible;
  } catch (const remat::OutOfMemoryError& e) {
    std::printf("%s: %s\n", name, e.what());
    return remat::cli::kExitInfeasible;
  } catch (const remat::ThrashError& e) {
    std::printf("%s: %s\n", name, e.what());
    return remat::cli::kExitInfeasible;
  }
}

// The first of `names` given on the command line, or empty: flags of one model given with
// the other.
std::string first_given(const remat::cli::FlagSet& flags,
                        std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (flags.given(n)) return n;
  return "";
}

int bad_flag(const std::string& message) {
  std::fprintf(stderr, "plain_c_train: %s\n", message.c_str());
  return remat::cli::kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  plain_c::Config config;
  plain_c::Gpt2Config gpt2;
  std::string model = "mlp";
  remat::StepDriverOptions options;
  remat::cli::DriverFlags driver_flags;
  int steps = 6;
  remat::cli::FlagSet flags(
      "plain_c_train", "[flags]",
      "Trains a model with its own plain-C kernels, on its own buffers and through remat under "
      "the budget, and says whether the losses and parameters match bit for bit: a residual "
      "MLP, or with --model gpt2 a GPT-2 shaped like llm.c's (embeddings, layernorm, causal "
      "attention, GELU MLP blocks, an untied head, crossentropy, AdamW).\nExit status: 0 they "
      "match (--backend sim, which runs no kernels: the budget held), 1 out of memory or a "
      "mismatch, 2 a bad flag.");
  remat::cli::add_driver_flags(flags, options, driver_flags,
                               "the unconstrained peak of the remat loop (measured first)");
  flags.add_choice("model", &model, {"mlp", "gpt2"}, "the loop trained");
  flags.add("steps", &steps, "training steps", 1);
  flags.add("blocks", &config.blocks, "mlp: residual blocks", 1);
  flags.add("batch", &gpt2.batch, "gpt2: sequences per step", 1);
  flags.add("seq", &gpt2.seq, "gpt2: tokens per sequence", 1);
  flags.add("layers", &gpt2.layers, "gpt2: transformer layers", 1);
  flags.add("channels", &gpt2.channels, "gpt2: channels, a multiple of --heads", 1);
  flags.add("heads", &gpt2.heads, "gpt2: attention heads", 1);
  flags.add("vocab", &gpt2.vocab, "gpt2: vocabulary size (the tokens are bytes modulo it)", 2);
  flags.add_switch("moments-on-host", &gpt2.moments_on_host,
                   "gpt2: keep AdamW's moments in host memory between updates, outside the "
                   "budget (--host-memory raised to twice their bytes where it is less)");
  if (std::optional<int> code = flags.parse(argc, const_cast<const char* const*>(argv)))
    return *code;
  remat::cli::apply_driver_flags(driver_flags, options);
  if (model == "mlp") {
    const std::string stray = first_given(
        flags, {"batch", "seq", "layers", "channels", "heads", "vocab", "moments-on-host"});
    if (!stray.empty()) return bad_flag("--" + stray + " is a flag of --model gpt2");
    plain_c::ReferenceLoop reference(config);
    plain_c::RematLoop loop(config);
    return train_and_compare("plain_c", reference, loop, options, driver_flags.budget, steps);
  }
  if (flags.given("blocks")) return bad_flag("--blocks is a flag of --model mlp");
  if (const std::string error = plain_c::gpt2_config_error(gpt2); !error.empty())
    return bad_flag("--model gpt2: " + error);
  plain_c::Gpt2ReferenceLoop reference(gpt2);
  plain_c::Gpt2RematLoop loop(gpt2);
  // Room for every moment with as much again to spare, so that the runtime's own offloads
  // (eviction victims, Note [Keep, recompute or offload]) never crowd the moments out.
  if (gpt2.moments_on_host)
    options.runtime.host_memory_bytes =
        std::max(options.runtime.host_memory_bytes, 2 * loop.moment_bytes());
  return train_and_compare("plain_c gpt2", reference, loop, options, driver_flags.budget, steps);
}
