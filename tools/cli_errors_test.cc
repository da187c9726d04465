// The command-line tools on the bad inputs of issue 23: each used to end in std::terminate
// (exit 134) or to run on nonsense. Now each exits with kExitError and one line on stderr
// that names the file, the line (or node) and the problem. Also the flags every tool shares
// (tools/cli): --help and --version, the budget rules and the exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tools/cli/exit_code.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct ToolRun {
  int exit_code = -1;
  std::string err, out;
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `tool args` from the build's bin directory, stderr captured (and stdout if asked).
ToolRun run_tool(const std::string& tool, const std::string& args, bool keep_stdout = false) {
  const fs::path bin = fs::path(REMAT_BIN_DIR) / tool;
  // ctest runs the tests of this file in parallel processes: the files are the test's own.
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string stem = std::string(test->test_suite_name()) + "." + test->name() + "." + tool;
  const fs::path err = fs::path(::testing::TempDir()) / (stem + ".stderr");
  const fs::path out = fs::path(::testing::TempDir()) / (stem + ".stdout");
  const std::string cmd = bin.string() + " " + args + " > " +
                          (keep_stdout ? out.string() : std::string("/dev/null")) + " 2> " +
                          err.string() + " < /dev/null";
  const int status = std::system(cmd.c_str());
  ToolRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.err = read_file(err);
  if (keep_stdout) r.out = read_file(out);
  return r;
}

std::string write(const std::string& name, const std::string& text) {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path p = fs::path(::testing::TempDir()) /
                     (std::string(test->test_suite_name()) + "." + test->name() + "." + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A clean failure: exit kExitError (a bad input file) and one line on stderr.
void expect_clean_failure(const ToolRun& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, remat::cli::kExitError) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fragment));
}

const char* kStart = R"({"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"})"
                     "\n";
const std::string kReleasedW = std::string(kStart) +
                               R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                               "\n"
                               R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                               "\n"
                               R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                               "\n";

class ReplayCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-replay")) GTEST_SKIP() << "no remat-replay";
  }
  ToolRun replay(const std::string& path) {
    return run_tool("remat-replay", path + " --policy dtr --budget-fraction 1");
  }
};

TEST_F(ReplayCli, UseOfAReleasedHandle) {
  const std::string path =
      write("use.log",
            kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  expect_clean_failure(replay(path), path + ":5: CALL 'f' reads argument 'w', released at line 4");
}

TEST_F(ReplayCli, MutateOfAReleasedHandle) {
  const std::string path = write(
      "mutate.log",
      kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"1"})"
                   "\n");
  expect_clean_failure(replay(path),
                       path + ":5: MUTATE 'add_' reads argument 'w', released at line 4");
}

TEST_F(ReplayCli, CopyOfAReleasedHandle) {
  const std::string path =
      write("copy.log",
            kReleasedW + R"({"DST":"c","INSTRUCTION":"COPY","SRC":"w"})"
                         "\n"
                         R"({"ARGS":["c"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  expect_clean_failure(replay(path), path + ":5: COPY reads SRC 'w', released at line 4");
}

TEST_F(ReplayCli, MemoryOf2To63) {
  const std::string path =
      write("huge.log", std::string(kStart) +
                            R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                            "\n"
                            R"({"INSTRUCTION":"MEMORY","MEMORY":"9223372036854775808","NAME":"w"})"
                            "\n");
  expect_clean_failure(replay(path), path + ":3: field MEMORY is out of range");
}

TEST_F(ReplayCli, TimeSumPast2To64) {
  const std::string path = write(
      "time.log",
      std::string(kStart) +
          R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"18446744073709551615"})"
          "\n"
          R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"g","RESULT":[],"TIME":"1"})"
          "\n");
  expect_clean_failure(replay(path), path + ":3: TIME 1 makes the trace's total time pass 2^64-1");
}

TEST_F(ReplayCli, DoubleRelease) {
  const std::string path =
      write("release.log", kReleasedW + R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                                        "\n");
  expect_clean_failure(replay(path), path + ":5: RELEASE of 'w', already released at line 4");
}

// A graph with a number beyond a double, and one where a group member reads another.
const char* kHugeGraph =
    R"({"format":"remat-graph-v1","name":"g","nodes":[{"id":0,"bytes":1e309,"inputs":[]}]})";
const char* kGroupGraph =
    R"({"format":"remat-graph-v1","name":"g","nodes":[{"id":0,"bytes":4,"kind":"input"},)"
    R"({"id":1,"bytes":4,"inputs":[0],"group":7},{"id":2,"bytes":4,"inputs":[1],"group":7}]})";

TEST(PlanCli, NumberBeyondADoubleAndGroupMembersReadingEachOther) {
  if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-plan")) GTEST_SKIP() << "no remat-plan";
  const std::string huge = write("huge.json", kHugeGraph);
  expect_clean_failure(run_tool("remat-plan", huge + " --algo chen"),
                       huge + ": bad JSON: number overflow parsing '1e309' at line 1, column");
  const std::string group = write("group.json", kGroupGraph);
  expect_clean_failure(run_tool("remat-plan", group + " --algo chen"),
                       group + ": node 2 ('2') reads node 1 ('1') of its own group 7");
}

TEST(CompareCli, BadGraphsAndTraces) {
  if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-compare")) GTEST_SKIP() << "no remat-compare";
  const std::string out = (fs::path(::testing::TempDir()) / "cli_errors_compare").string();
  const std::string huge = write("huge.json", kHugeGraph);
  expect_clean_failure(run_tool("remat-compare", huge + " --out " + out),
                       huge + ": bad JSON: number overflow parsing '1e309'");
  const std::string group = write("group.json", kGroupGraph);
  expect_clean_failure(run_tool("remat-compare", group + " --out " + out),
                       group + ": node 2 ('2') reads node 1 ('1') of its own group 7");
  const std::string trace =
      write("use.log",
            kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  expect_clean_failure(run_tool("remat-compare", trace + " --out " + out),
                       trace + ":5: CALL 'f' reads argument 'w', released at line 4");
}

// A four-node chain: an input and three ops, 100 bytes each.
std::string chain_graph() {
  return write("chain.json",
               R"({"format":"remat-graph-v1","name":"chain","nodes":[)"
               R"({"id":0,"bytes":100,"kind":"input"},{"id":1,"bytes":100,"inputs":[0],"cost":1},)"
               R"({"id":2,"bytes":100,"inputs":[1],"cost":1},{"id":3,"bytes":100,"inputs":[2],)"
               R"("cost":1}]})");
}

// Every tool, with the arguments it needs to get as far as reading its flags.
struct Tool {
  const char* name;
  std::string args;
};
std::vector<Tool> tools() {
  const std::string graph = std::string(REMAT_SOURCE_DIR) + "/examples/traces/mlp12.log";
  std::vector<Tool> tools = {{"remat-replay", graph + " --policy dtr"},
                             {"remat-compare", graph + " --planners chen --policies dtr"},
                             {"mlp_train", "--steps 1"},
                             {"gpt_train", "--steps 1"},
                             {"plain_c_train", "--steps 1"}};
  if (fs::exists(fs::path(REMAT_BIN_DIR) / "remat-plan"))
    tools.push_back({"remat-plan", chain_graph() + " --algo chen"});
  return tools;
}

TEST(EveryTool, HelpListsTheFlagsAndExitsZero) {
  for (const Tool& t : tools()) {
    const ToolRun help = run_tool(t.name, "--help", /*keep_stdout=*/true);
    EXPECT_EQ(help.exit_code, remat::cli::kExitOk) << t.name << ": " << help.err;
    EXPECT_THAT(help.out, HasSubstr(std::string("usage: ") + t.name)) << t.name;
    EXPECT_THAT(help.out, HasSubstr("--version")) << t.name;
    EXPECT_THAT(help.out, HasSubstr("(default ")) << t.name;
    const ToolRun version = run_tool(t.name, "--version", true);
    EXPECT_EQ(version.exit_code, remat::cli::kExitOk) << t.name;
    EXPECT_THAT(version.out, HasSubstr("(remat) ")) << t.name;
  }
}

TEST(EveryTool, OneBudgetRule) {
  for (const Tool& t : tools()) {
    const bool compare = std::string(t.name) == "remat-compare";
    for (const char* bad : {"1e30", "inf", "nan", "1.5", "0", "-0.5", "half"}) {
      const std::string flag = compare ? " --budgets " : " --budget-fraction ";
      const ToolRun r = run_tool(t.name, t.args + flag + bad);
      EXPECT_EQ(r.exit_code, remat::cli::kExitError) << t.name << " " << bad;
      EXPECT_THAT(r.err, HasSubstr("wants a number in (0, 1]")) << t.name << " " << bad;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
    if (compare) continue;
    for (const char* bad : {"1e30", "-1", "12.5", "5XB", "inf"}) {
      const ToolRun r = run_tool(t.name, t.args + " --budget " + bad);
      EXPECT_EQ(r.exit_code, remat::cli::kExitError) << t.name << " " << bad;
      EXPECT_THAT(r.err, HasSubstr("is not a budget")) << t.name << " " << bad;
    }
    const ToolRun both = run_tool(t.name, t.args + " --budget 1GiB --budget-fraction 0.5");
    EXPECT_EQ(both.exit_code, remat::cli::kExitError) << t.name;
    EXPECT_THAT(both.err, HasSubstr("not both")) << t.name;
    const ToolRun unknown = run_tool(t.name, t.args + " --nope 3");
    EXPECT_EQ(unknown.exit_code, remat::cli::kExitError) << t.name;
    EXPECT_THAT(unknown.err, HasSubstr("unrecognised option '--nope'")) << t.name;
  }
}

TEST(ExitCodes, PlanSaysFeasibleOrNot) {
  if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-plan")) GTEST_SKIP() << "no remat-plan";
  const std::string graph = chain_graph();
  EXPECT_EQ(run_tool("remat-plan", graph + " --algo chen --budget-fraction 1").exit_code,
            remat::cli::kExitOk);
  EXPECT_EQ(run_tool("remat-plan", graph + " --algo chen --budget 1").exit_code,
            remat::cli::kExitInfeasible);
}

TEST(ExitCodes, ReplaySaysWhetherEveryRunFit) {
  const std::string trace = std::string(REMAT_SOURCE_DIR) + "/examples/traces/mlp12.log";
  EXPECT_EQ(run_tool("remat-replay", trace + " --policy dtr --budget-fraction 1").exit_code,
            remat::cli::kExitOk);
  // At 0.1 the step cannot fit: exit 1, and the row has no slowdown (its time is not a step's).
  const ToolRun r = run_tool("remat-replay", trace + " --policy dtr --budget-fraction 0.1 --json",
                             /*keep_stdout=*/true);
  EXPECT_EQ(r.exit_code, remat::cli::kExitInfeasible) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("slowdown":null)"));
  EXPECT_THAT(r.out, HasSubstr(R"("status":"oom")"));
}

// The simulated backend runs no kernels, so there is nothing to read back and compare: the
// run says whether the budget held (it used to end in std::terminate reading parameters).
TEST(ExitCodes, PlainCOnTheSimulatedBackendSaysWhetherTheBudgetHeld) {
  for (const char* model : {"", " --model gpt2 --seq 16 --layers 1 --channels 32 --vocab 64"}) {
    const ToolRun r = run_tool("plain_c_train",
                               std::string("--backend sim --steps 2 --budget-fraction 0.6") + model,
                               /*keep_stdout=*/true);
    EXPECT_EQ(r.exit_code, remat::cli::kExitOk) << model << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("runs no kernels")) << model;
  }
}

TEST(CompareCli, UnknownPoliciesAndAFileForOut) {
  const std::string trace = std::string(REMAT_SOURCE_DIR) + "/examples/traces/mlp12.log";
  const ToolRun policy = run_tool("remat-compare", trace + " --policies dtr,nope");
  EXPECT_EQ(policy.exit_code, remat::cli::kExitError);
  EXPECT_THAT(policy.err, HasSubstr("unknown policy 'nope' in --policies"));
  const std::string file = write("not_a_dir", "x");
  const ToolRun out = run_tool("remat-compare", trace + " --out " + file);
  EXPECT_EQ(out.exit_code, remat::cli::kExitError);
  EXPECT_THAT(out.err, HasSubstr("exists and is not a directory"));
}

}  // namespace
