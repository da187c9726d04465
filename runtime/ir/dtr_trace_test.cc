#include "remat/dtr_trace.h"

#include <gtest/gtest.h>

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

TEST(DtrTraceTest, MissingFileIsNotFound) {
  auto trace = read_dtr_trace_file("/nonexistent/trace.log");
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace remat
