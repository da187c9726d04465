// The command-line tools on the bad inputs of issue 23: each used to end in std::terminate
// (exit 134) or to run on nonsense. Now each exits with an error code and one line on stderr
// that names the file, the line (or node) and the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct ToolRun {
  int exit_code = -1;
  std::string err;
};

// Runs `tool args` from the build's bin directory, stderr captured.
ToolRun RunTool(const std::string& tool, const std::string& args) {
  const fs::path bin = fs::path(REMAT_BIN_DIR) / tool;
  const fs::path err = fs::path(::testing::TempDir()) / (tool + ".stderr");
  const std::string cmd =
      bin.string() + " " + args + " > /dev/null 2> " + err.string() + " < /dev/null";
  const int status = std::system(cmd.c_str());
  ToolRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::ifstream in(err);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  return r;
}

std::string Write(const std::string& name, const std::string& text) {
  const fs::path p = fs::path(::testing::TempDir()) / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A clean failure: exit 1 (a bad input file) and one line on stderr.
void ExpectCleanFailure(const ToolRun& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
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
  ToolRun Replay(const std::string& path) {
    return RunTool("remat-replay", path + " --policy dtr --budget-fraction 1");
  }
};

TEST_F(ReplayCli, UseOfAReleasedHandle) {
  const std::string path =
      Write("use.log",
            kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  ExpectCleanFailure(Replay(path), path + ":5: CALL 'f' reads argument 'w', released at line 4");
}

TEST_F(ReplayCli, MutateOfAReleasedHandle) {
  const std::string path = Write(
      "mutate.log",
      kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"1"})"
                   "\n");
  ExpectCleanFailure(Replay(path),
                     path + ":5: MUTATE 'add_' reads argument 'w', released at line 4");
}

TEST_F(ReplayCli, CopyOfAReleasedHandle) {
  const std::string path =
      Write("copy.log",
            kReleasedW + R"({"DST":"c","INSTRUCTION":"COPY","SRC":"w"})"
                         "\n"
                         R"({"ARGS":["c"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  ExpectCleanFailure(Replay(path), path + ":5: COPY reads SRC 'w', released at line 4");
}

TEST_F(ReplayCli, MemoryOf2To63) {
  const std::string path =
      Write("huge.log", std::string(kStart) +
                            R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                            "\n"
                            R"({"INSTRUCTION":"MEMORY","MEMORY":"9223372036854775808","NAME":"w"})"
                            "\n");
  ExpectCleanFailure(Replay(path), path + ":3: field MEMORY is out of range");
}

TEST_F(ReplayCli, TimeSumPast2To64) {
  const std::string path = Write(
      "time.log",
      std::string(kStart) +
          R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"18446744073709551615"})"
          "\n"
          R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"g","RESULT":[],"TIME":"1"})"
          "\n");
  ExpectCleanFailure(Replay(path), path + ":3: TIME 1 makes the trace's total time pass 2^64-1");
}

TEST_F(ReplayCli, DoubleRelease) {
  const std::string path =
      Write("release.log", kReleasedW + R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                                        "\n");
  ExpectCleanFailure(Replay(path), path + ":5: RELEASE of 'w', already released at line 4");
}

// A graph with a number beyond a double, and one where a group member reads another.
const char* kHugeGraph =
    R"({"format":"remat-graph-v1","name":"g","nodes":[{"id":0,"bytes":1e309,"inputs":[]}]})";
const char* kGroupGraph =
    R"({"format":"remat-graph-v1","name":"g","nodes":[{"id":0,"bytes":4,"kind":"input"},)"
    R"({"id":1,"bytes":4,"inputs":[0],"group":7},{"id":2,"bytes":4,"inputs":[1],"group":7}]})";

TEST(PlanCli, NumberBeyondADoubleAndGroupMembersReadingEachOther) {
  if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-plan")) GTEST_SKIP() << "no remat-plan";
  const std::string huge = Write("huge.json", kHugeGraph);
  ExpectCleanFailure(RunTool("remat-plan", huge + " --algo chen"),
                     huge + ": bad JSON: number overflow parsing '1e309' at line 1, column");
  const std::string group = Write("group.json", kGroupGraph);
  ExpectCleanFailure(RunTool("remat-plan", group + " --algo chen"),
                     group + ": node 2 ('2') reads node 1 ('1') of its own group 7");
}

TEST(CompareCli, BadGraphsAndTraces) {
  if (!fs::exists(fs::path(REMAT_BIN_DIR) / "remat-compare")) GTEST_SKIP() << "no remat-compare";
  const std::string out = (fs::path(::testing::TempDir()) / "cli_errors_compare").string();
  const std::string huge = Write("huge.json", kHugeGraph);
  ExpectCleanFailure(RunTool("remat-compare", huge + " --out " + out),
                     huge + ": bad JSON: number overflow parsing '1e309'");
  const std::string group = Write("group.json", kGroupGraph);
  ExpectCleanFailure(RunTool("remat-compare", group + " --out " + out),
                     group + ": node 2 ('2') reads node 1 ('1') of its own group 7");
  const std::string trace =
      Write("use.log",
            kReleasedW + R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n");
  ExpectCleanFailure(RunTool("remat-compare", trace + " --out " + out),
                     trace + ":5: CALL 'f' reads argument 'w', released at line 4");
}

}  // namespace
