// The worked example of docs/integrating.md as a program: the plain-C loop on its own
// buffers, then the same kernels through remat under a budget, and whether they agree.
#include <cstdio>
#include <cstring>
#include <optional>

#include "examples/plain_c/model.h"
#include "remat/byte_size.h"
#include "remat/errors.h"
#include "tools/cli/driver_flags.h"
#include "tools/cli/exit_code.h"

int main(int argc, char** argv) {
  plain_c::Config config;
  remat::StepDriverOptions options;
  remat::cli::DriverFlags driver_flags;
  int steps = 6;
  remat::cli::FlagSet flags("plain_c_train", "[flags]",
                            "Trains a residual MLP with its own plain-C kernels, on its own "
                            "buffers and through remat under the budget, and says whether the "
                            "losses and parameters match bit for bit.\nExit status: 0 they "
                            "match, 1 out of memory or a mismatch, 2 a bad flag.");
  remat::cli::add_driver_flags(flags, options, driver_flags,
                               "the unconstrained peak of the remat loop (measured first)");
  flags.add("steps", &steps, "training steps", 1);
  flags.add("blocks", &config.blocks, "residual blocks", 1);
  if (std::optional<int> code = flags.parse(argc, const_cast<const char* const*>(argv)))
    return *code;
  remat::cli::apply_driver_flags(driver_flags, options);
  plain_c::ReferenceLoop reference(config);
  for (int s = 0; s < steps; ++s) reference.step(s);
  plain_c::RematLoop loop(config);
  const std::size_t peak = remat::measure_unconstrained_peak(loop, options.runtime, steps);
  if (driver_flags.budget.fraction)
    options.runtime.budget = static_cast<std::size_t>(*driver_flags.budget.fraction * peak);
  try {
    remat::StepDriver driver(loop, options);
    for (int s = 0; s < steps; ++s) driver.run(s);
    const auto& losses = plain_c::RematLoop::losses(driver.state());
    bool same = losses.size() == reference.losses().size() &&
                std::memcmp(losses.data(), reference.losses().data(), losses.size() * 4) == 0;
    const auto params = plain_c::RematLoop::parameters(driver.runtime(), driver.state());
    for (std::size_t i = 0; same && i < params.size(); ++i)
      same = params[i] == reference.parameters()[i];
    std::printf("plain_c: %d steps, final loss %.6f; budget %s of unconstrained peak %s\n  %s\n",
                steps, static_cast<double>(losses.back()),
                options.runtime.budget == SIZE_MAX
                    ? "none"
                    : remat::format_byte_size(options.runtime.budget).c_str(),
                remat::format_byte_size(peak).c_str(), driver.runtime().stats().summary().c_str());
    std::printf("  losses and parameters match the plain-C loop bit for bit: %s\n",
                same ? "yes" : "no");
    return same ? remat::cli::kExitOk : remat::cli::kExitInfeasible;
  } catch (const remat::OutOfMemoryError& e) {
    std::printf("plain_c: %s\n", e.what());
    return remat::cli::kExitInfeasible;
  }
}
