#include "tools/cli/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace remat::cli {
namespace {

using ::testing::HasSubstr;

// A tool's flags, as each tool declares them.
struct Tool {
  std::string input, algo = "chen", mode = "fast";
  double limit = 60;
  int k = -1;
  std::int64_t steps = 10;
  bool json = false;
  std::vector<std::string> planners = {"a", "b"};
  BudgetFlags budget;
  FlagSet flags{"tool", "INPUT [flags]", "A tool for the tests."};

  Tool() {
    flags.add_positional("input", &input, "the input file");
    flags.add("algo", &algo, "the planner");
    flags.add("time-limit", &limit, "seconds", 0.001);
    flags.add("k", &k, "a knob");
    flags.add("steps", &steps, "steps to run", 0);
    flags.add_switch("json", &json, "JSON output");
    flags.add_choice("mode", &mode, {"fast", "slow"}, "how");
    flags.add_list("planners", &planners, "planners to run");
    flags.add_budget(&budget, "the unconstrained peak");
  }
  std::optional<int> parse(std::vector<const char*> args) {
    args.insert(args.begin(), "tool");
    return flags.parse(static_cast<int>(args.size()), args.data());
  }
};

TEST(FlagSet, ReadsEveryKindOfFlag) {
  Tool t;
  EXPECT_EQ(t.parse({"g.json", "--algo", "rotor", "--time-limit=2.5", "--k", "-3", "--steps", "4",
                     "--json", "--mode", "slow", "--planners", "x,,y", "--budget", "1.5KiB"}),
            std::nullopt);
  EXPECT_EQ(t.input, "g.json");
  EXPECT_EQ(t.algo, "rotor");
  EXPECT_EQ(t.limit, 2.5);
  EXPECT_EQ(t.k, -3);
  EXPECT_EQ(t.steps, 4);
  EXPECT_TRUE(t.json);
  EXPECT_EQ(t.mode, "slow");
  EXPECT_EQ(t.planners, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(t.budget.bytes, 1536u);
  EXPECT_FALSE(t.budget.fraction.has_value());
  EXPECT_TRUE(t.flags.given("algo"));
  EXPECT_FALSE(t.flags.given("budget-fraction"));
}

TEST(FlagSet, DefaultsStayWhenAbsent) {
  Tool t;
  EXPECT_EQ(t.parse({}), std::nullopt);
  EXPECT_EQ(t.input, "");
  EXPECT_EQ(t.algo, "chen");
  EXPECT_EQ(t.limit, 60);
  EXPECT_FALSE(t.json);
  EXPECT_FALSE(t.budget.given());
}

TEST(FlagSet, HelpListsEveryFlagWithItsDefaultAndExitsZero) {
  Tool t;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(t.parse({"--help"}), kExitOk);
  const std::string out = ::testing::internal::GetCapturedStdout();
  for (const char* part :
       {"usage: tool INPUT [flags]", "--algo S", "(default chen)", "--time-limit X", "(default 60)",
        "--json", "--mode fast|slow", "--planners A,B,...", "(default a,b)", "--budget BYTES",
        "--budget-fraction F", "the unconstrained peak", "--version", "input"})
    EXPECT_THAT(out, HasSubstr(part));
  Tool h;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(h.parse({"-h"}), kExitOk);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), out);
}

TEST(FlagSet, VersionExitsZero) {
  Tool t;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(t.parse({"--version"}), kExitOk);
  EXPECT_THAT(::testing::internal::GetCapturedStdout(), HasSubstr("tool (remat) " + version()));
}

// Each mistake: exit kExitError and one stderr line naming the flag and the value.
TEST(FlagSet, MistakesNameTheFlag) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--nope"}, "unrecognised option '--nope'"},
      {{"--algo"}, "'--algo' is missing"},
      {{"--time-limit", "0"}, "--time-limit 0: wants a number of at least 0.001"},
      {{"--time-limit", "inf"}, "--time-limit inf: wants a finite number"},
      {{"--steps", "x"}, "--steps x: wants an integer"},
      {{"--steps", "99999999999999999999"}, "--steps 99999999999999999999: wants an integer"},
      {{"--mode", "medium"}, "--mode medium: wants one of fast, slow"},
      {{"--planners", ","}, "--planners ,: wants a comma-separated list"},
      {{"--budget-fraction", "1e30"}, "wants a number in (0, 1]"},
      {{"--budget-fraction", "nan"}, "wants a number in (0, 1]"},
      {{"--budget", "1e30"}, "over 2^62 bytes"},
      {{"--budget", "1GiB", "--budget-fraction", "0.5"}, "not both"},
      {{"a", "b"}, "too many positional options"},
      {{"--algo", "x", "--algo", "y"}, "more than once"},
      {{"--json=yes"}, "json"},
  };
  for (const auto& [args, message] : cases) {
    Tool t;
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(t.parse(args), kExitError) << message;
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr(message));
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST(FlagSet, PeekFindsAValueBeforeParsing) {
  const char* argv[] = {"tool", "x.json", "--example", "gpt", "--other=1", "--last"};
  EXPECT_EQ(FlagSet::peek(6, argv, "example"), "gpt");
  EXPECT_EQ(FlagSet::peek(6, argv, "other"), "1");
  EXPECT_EQ(FlagSet::peek(6, argv, "last"), std::nullopt);
  EXPECT_EQ(FlagSet::peek(6, argv, "missing"), std::nullopt);
}

}  // namespace
}  // namespace remat::cli
