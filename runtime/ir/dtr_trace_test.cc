#include "remat/dtr_trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace remat {
namespace {

using Kind = DtrInstruction::Kind;

const char* kValid = R"({"INSTRUCTION":"CONSTANT","NAME":"ignored_before_start"}
{"INSTRUCTION":"MEMORY","MEMORY":"1","NAME":"ignored_before_start"}
{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"400","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"split","RESULT":["a","b"],"TIME":"1000"}
{"INSTRUCTION":"MEMORY","MEMORY":"200","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"INSTRUCTION":"MEMORY","MEMORY":"200","NAME":"b"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"b"}
{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}
{"ARGS":["a","w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"50"}
{"DST":"c","INSTRUCTION":"COPY","SRC":"a"}
{"DST":"c","INSTRUCTION":"COPY_FROM","SRC":"b"}
{"INSTRUCTION":"RELEASE","NAME":"b"}
)";

absl::StatusOr<DtrTrace> parse(const std::string& text) {
  std::istringstream in(text);
  return parse_dtr_trace(in, "t");
}

TEST(DtrTraceTest, ParsesEveryInstruction) {
  auto trace = parse(kValid);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const auto& in = trace->instructions;
  ASSERT_EQ(in.size(), 7u);
  EXPECT_EQ(in[0].kind, Kind::kConstant);
  EXPECT_EQ(in[0].bytes[0], 400u);
  EXPECT_EQ(in[1].kind, Kind::kCall);
  EXPECT_EQ(in[1].op, "split");
  EXPECT_EQ(in[1].alias, (std::vector<int>{-1, 0}));
  EXPECT_EQ(in[1].bytes, (std::vector<std::uint64_t>{200, 200}));
  EXPECT_EQ(in[1].line, 6);
  EXPECT_EQ(in[2].kind, Kind::kBackward);
  EXPECT_EQ(in[3].kind, Kind::kMutate);
  EXPECT_EQ(in[3].mutate, (std::vector<int>{0}));
  EXPECT_EQ(in[4].kind, Kind::kCopy);
  EXPECT_EQ(in[5].kind, Kind::kCopyFrom);
  EXPECT_EQ(in[6].kind, Kind::kRelease);
  EXPECT_EQ(trace->total_time_ns, 1050u);
  EXPECT_EQ(trace->handle_names[in[6].dst], "b");
}

struct BadCase {
  std::string name;
  std::string text;
  std::string expect;  // a fragment of the message, with the line
};

// gtest prints a parameter by its name rather than as a dump of its bytes.
void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class DtrTraceErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(DtrTraceErrorTest, NamesTheLine) {
  auto trace = parse(GetParam().text);
  ASSERT_FALSE(trace.ok());
  EXPECT_NE(std::string(trace.status().message()).find(GetParam().expect), std::string::npos)
      << trace.status();
}

const std::string kStart = "{\"ANNOTATION\":\"START\",\"INSTRUCTION\":\"ANNOTATE\"}\n";

INSTANTIATE_TEST_SUITE_P(
    Malformed, DtrTraceErrorTest,
    ::testing::Values(
        BadCase{"BadJson", kStart + "{not json\n", "t:2: not a JSON object"},
        BadCase{"UnknownInstruction",
                kStart + R"({"INSTRUCTION":"JUMP"})"
                         "\n",
                "t:2: unknown INSTRUCTION 'JUMP'"},
        BadCase{"UnknownHandle",
                kStart + R"({"ARGS":["zz"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                         "\n",
                "t:2: unknown handle 'zz'"},
        BadCase{"NegativeMemory",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"-5","NAME":"w"})"
                         "\n",
                "t:3: field MEMORY is not a non-negative integer"},
        BadCase{"MissingMemory",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                         "\n",
                "t:3: expected a MEMORY line for 'w'"},
        BadCase{"WrongName",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"v"})"
                         "\n",
                "t:3: MEMORY line names 'v', expected 'w'"},
        BadCase{"BadAlias",
                kStart +
                    R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                    "\n"
                    R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                    "\n"
                    R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x"],"TIME":"1"})"
                    "\n"
                    R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"x"})"
                    "\n"
                    R"({"ALIAS":"3","INSTRUCTION":"ALIAS","NAME":"x"})"
                    "\n",
                "t:6: ALIAS 3 is not -1 or an argument index"},
        BadCase{"BadMutateIndex",
                kStart +
                    R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                    "\n"
                    R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                    "\n"
                    R"({"ARGS":["w"],"INSTRUCTION":"MUTATE","MUTATE":[2],"NAME":"f","TIME":"1"})"
                    "\n",
                "t:4: MUTATE index 2"},
        BadCase{"Truncated",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n",
                "ends inside the MEMORY/ALIAS lines of line 2"},
        BadCase{"NoStart",
                R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                "\n",
                "no START annotation"},
        BadCase{"MissingTime",
                kStart + R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"f","RESULT":[]})"
                         "\n",
                "t:2: missing field TIME"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// A constant w (line 2) released at line 4.
const std::string kReleasedW = kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                                        "\n"
                                        R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                                        "\n"
                                        R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                                        "\n";
const std::string kLiveW = kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                                    "\n"
                                    R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                                    "\n";

// The inputs of issue 23 that remat-replay aborted on (std::terminate inside the runtime) or
// replayed wrongly, and those it accepted silently: each is now an error naming its line.
INSTANTIATE_TEST_SUITE_P(
    Semantics, DtrTraceErrorTest,
    ::testing::Values(
        BadCase{"CallReadsReleasedHandle",
                kReleasedW +
                    R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"1"})"
                    "\n",
                "t:5: CALL 'f' reads argument 'w', released at line 4"},
        BadCase{"MutateOfReleasedHandle",
                kReleasedW +
                    R"({"ARGS":["w"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"1"})"
                    "\n",
                "t:5: MUTATE 'add_' reads argument 'w', released at line 4"},
        BadCase{"CopyOfReleasedHandle",
                kReleasedW + R"({"DST":"c","INSTRUCTION":"COPY","SRC":"w"})"
                             "\n",
                "t:5: COPY reads SRC 'w', released at line 4"},
        BadCase{"CopyFromOfReleasedHandle",
                kReleasedW + R"({"DST":"c","INSTRUCTION":"COPY_FROM","SRC":"w"})"
                             "\n",
                "t:5: COPY_FROM reads SRC 'w', released at line 4"},
        BadCase{"DoubleRelease",
                kReleasedW + R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
                             "\n",
                "t:5: RELEASE of 'w', already released at line 4"},
        BadCase{
            "DuplicateResults",
            kLiveW +
                R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"split","RESULT":["a","a"],"TIME":"1"})"
                "\n"
                R"({"INSTRUCTION":"MEMORY","MEMORY":"2","NAME":"a"})"
                "\n"
                R"({"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"})"
                "\n"
                R"({"INSTRUCTION":"MEMORY","MEMORY":"2","NAME":"a"})"
                "\n"
                R"({"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"})"
                "\n",
            "t:4: CALL 'split' lists result 'a' twice"},
        BadCase{"CallRedefinesLiveHandle",
                kLiveW +
                    R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["w"],"TIME":"1"})"
                    "\n"
                    R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                    "\n"
                    R"({"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"w"})"
                    "\n",
                "t:4: CALL 'f' redefines 'w', a handle live since line 2"},
        BadCase{"ConstantRedefinesLiveHandle",
                kLiveW + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"5","NAME":"w"})"
                         "\n",
                "t:4: CONSTANT defines 'w', a handle live since line 2"},
        BadCase{"CopyToLiveHandle",
                kLiveW + R"({"DST":"w","INSTRUCTION":"COPY","SRC":"w"})"
                         "\n",
                "t:4: COPY to 'w', a handle live since line 2"},
        BadCase{"MemoryOf2To63",  // was u8[-9223372036854775808] and an abort in the runtime
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"9223372036854775808","NAME":"w"})"
                         "\n",
                "t:3: field MEMORY is out of range: 9223372036854775808 (at most "
                "4611686018427387904)"},
        BadCase{"MemoryPastUint64",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"18446744073709551616","NAME":"w"})"
                         "\n",
                "t:3: field MEMORY is out of range: '18446744073709551616'"},
        BadCase{"MemoryBeyondADouble",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":1e309,"NAME":"w"})"
                         "\n",
                "t:3: not a JSON object: number overflow parsing '1e309'"},
        BadCase{"MemorySumPast2To62",
                kStart + R"({"INSTRUCTION":"CONSTANT","NAME":"v"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"4611686018427387904","NAME":"v"})"
                         "\n"
                         R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
                         "\n"
                         R"({"INSTRUCTION":"MEMORY","MEMORY":"1","NAME":"w"})"
                         "\n",
                "t:4: the size of 'w', 1 bytes, makes the tensors of the trace add up to more "
                "than 2^62 bytes"},
        BadCase{
            "TimeSumWraps",  // replayed as "thrash" at budget 1.0 when the sum wrapped
            kStart +
                R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"f","RESULT":[],"TIME":"18446744073709551615"})"
                "\n"
                R"({"ARGS":[],"INSTRUCTION":"CALL","NAME":"g","RESULT":[],"TIME":"2"})"
                "\n",
            "t:3: TIME 2 makes the trace's total time pass 2^64-1 ns"},
        BadCase{
            "MutateIndexTwice",
            kLiveW +
                R"({"ARGS":["w"],"INSTRUCTION":"MUTATE","MUTATE":[0,0],"NAME":"add_","TIME":"1"})"
                "\n",
            "t:4: MUTATE 'add_' lists MUTATE index 0 twice"},
        BadCase{"HandleNameIsShownOnOneLine",
                kStart + R"({"INSTRUCTION":"RELEASE","NAME":"a\nb"})"
                         "\n",
                "t:2: unknown handle 'a\\nb'"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(DtrTraceTest, ReleasedHandleMayBeDefinedAgainAndCopyFromRebinds) {
  auto trace = parse(
      kReleasedW +
      R"({"INSTRUCTION":"CONSTANT","NAME":"w"})"
      "\n"
      R"({"INSTRUCTION":"MEMORY","MEMORY":"7","NAME":"w"})"
      "\n"
      R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"f","RESULT":["x"],"TIME":"18446744073709551614"})"
      "\n"
      R"({"INSTRUCTION":"MEMORY","MEMORY":"4611686018427387892","NAME":"x"})"
      "\n"
      R"({"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x"})"
      "\n"
      R"({"DST":"w","INSTRUCTION":"COPY_FROM","SRC":"x"})"
      "\n"
      R"({"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"g","RESULT":[],"TIME":"1"})"
      "\n");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->total_time_ns, UINT64_MAX);  // sizes and times up to the limits are fine
  EXPECT_TRUE(validate_dtr_trace(*trace).ok());
}

TEST(DtrTraceTest, FileErrorsNameThePath) {
  const std::string path = ::testing::TempDir() + "/dtr_trace_test_bad.log";
  {
    std::ofstream out(path);
    out << kReleasedW << R"({"INSTRUCTION":"RELEASE","NAME":"w"})"
        << "\n";
  }
  auto trace = read_dtr_trace_file(path);
  ASSERT_FALSE(trace.ok());
  EXPECT_EQ(trace.status().message(), path + ":5: RELEASE of 'w', already released at line 4");
}

// Traces built in code: validate_dtr_trace names the instruction by its position.
TEST(DtrTraceTest, ValidateChecksTracesBuiltInCode) {
  DtrTrace t;
  t.name = "built";
  t.handle_names = {"a", "b"};
  DtrInstruction c;
  c.kind = Kind::kConstant;
  c.results = {0};
  c.bytes = {8};
  DtrInstruction call;
  call.kind = Kind::kCall;
  call.op = "f";
  call.args = {0};
  call.results = {1};
  call.bytes = {8};
  call.alias = {-1};
  call.time_ns = 3;
  DtrInstruction rel;
  rel.kind = Kind::kRelease;
  rel.dst = 0;
  t.instructions = {c, rel, call};
  t.total_time_ns = 3;
  EXPECT_EQ(validate_dtr_trace(t).message(),
            "trace 'built': instruction 2: CALL 'f' reads argument 'a', released at instruction 1 "
            "(a released handle cannot be used, mutated or copied)");
  t.instructions = {c, call, rel};
  EXPECT_TRUE(validate_dtr_trace(t).ok()) << validate_dtr_trace(t);
  t.total_time_ns = 4;
  EXPECT_THAT(std::string(validate_dtr_trace(t).message()),
              ::testing::HasSubstr("TIME adds up to 3"));
  t.total_time_ns = 3;
  t.instructions[1].alias.clear();  // the replay would index past it
  EXPECT_THAT(std::string(validate_dtr_trace(t).message()),
              ::testing::HasSubstr("1 results but 1 sizes and 0 alias entries"));
  t.instructions[1].alias = {-1};
  t.instructions[1].args = {7};
  EXPECT_THAT(std::string(validate_dtr_trace(t).message()),
              ::testing::HasSubstr("handle index 7 is past the 2 handle names"));
}

TEST(DtrTraceTest, MissingFileIsNotFound) {
  auto trace = read_dtr_trace_file("/nonexistent/trace.log");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace remat
