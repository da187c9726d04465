#include "remat/timeline_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace remat {
namespace {

using json = nlohmann::json;
using Kind = TimelineEvent::Kind;

Timeline small_timeline() {
  Timeline t;
  t.events = {
      {Kind::kCompute, "conv1", 0, 2000, 400},
      {Kind::kCompute, "relu1", 2000, 500, 400},
      {Kind::kEvict, "conv1", 2500, 0, 400},
      {Kind::kRecompute, "conv1", 2500, 2000, 400},
  };
  t.memory = {{2000, 400, 512}, {2500, 800, 1024}, {2500, 400, 1024}, {4500, 800, 1024}};
  t.budget = 1000;
  return t;
}

json write(const Timeline& t, std::string_view title = "step 0") {
  std::ostringstream out;
  absl::Status status = write_timeline_file(t, title, out);
  EXPECT_TRUE(status.ok()) << status;
  return json::parse(out.str());
}

std::vector<json> with_phase(const json& trace, std::string_view ph) {
  std::vector<json> result;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == ph) result.push_back(e);
  }
  return result;
}

TEST(TimelineTest, WritesTopLevelObject) {
  json trace = write(small_timeline());
  ASSERT_TRUE(trace.is_object());
  EXPECT_TRUE(trace.at("traceEvents").is_array());
  EXPECT_EQ(trace.at("displayTimeUnit"), "ns");
  EXPECT_TRUE(trace.at("otherData").is_object());
  for (const json& e : trace.at("traceEvents")) EXPECT_EQ(e.at("pid"), 1) << e;
}

TEST(TimelineTest, NamesProcessAndThreads) {
  std::vector<json> meta = with_phase(write(small_timeline(), "gpt step 0 @ 0.5"), "M");
  ASSERT_EQ(meta.size(), 3u);
  EXPECT_EQ(meta[0].at("name"), "process_name");
  EXPECT_EQ(meta[0].at("args").at("name"), "gpt step 0 @ 0.5");
  EXPECT_EQ(meta[1].at("name"), "thread_name");
  EXPECT_EQ(meta[1].at("tid"), 1);
  EXPECT_EQ(meta[1].at("args").at("name"), "ops");
  EXPECT_EQ(meta[2].at("name"), "thread_name");
  EXPECT_EQ(meta[2].at("tid"), 2);
  EXPECT_EQ(meta[2].at("args").at("name"), "recomputations");
}

TEST(TimelineTest, WritesSlicesInMicroseconds) {
  std::vector<json> slices = with_phase(write(small_timeline()), "X");
  ASSERT_EQ(slices.size(), 3u);

  EXPECT_EQ(slices[0].at("name"), "conv1");
  EXPECT_EQ(slices[0].at("cat"), "compute");
  EXPECT_EQ(slices[0].at("tid"), 1);
  EXPECT_DOUBLE_EQ(slices[0].at("ts").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(slices[0].at("dur").get<double>(), 2.0);
  EXPECT_EQ(slices[0].at("args").at("bytes"), 400);

  EXPECT_EQ(slices[1].at("name"), "relu1");
  EXPECT_DOUBLE_EQ(slices[1].at("ts").get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(slices[1].at("dur").get<double>(), 0.5);

  EXPECT_EQ(slices[2].at("name"), "conv1");
  EXPECT_EQ(slices[2].at("cat"), "recompute");
  EXPECT_EQ(slices[2].at("tid"), 2);
  EXPECT_DOUBLE_EQ(slices[2].at("ts").get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(slices[2].at("dur").get<double>(), 2.0);
}

TEST(TimelineTest, WritesEvictionsAsInstants) {
  std::vector<json> instants = with_phase(write(small_timeline()), "i");
  ASSERT_EQ(instants.size(), 1u);
  EXPECT_EQ(instants[0].at("name"), "evict conv1");
  EXPECT_EQ(instants[0].at("cat"), "evict");
  EXPECT_EQ(instants[0].at("s"), "t");
  EXPECT_EQ(instants[0].at("tid"), 1);
  EXPECT_DOUBLE_EQ(instants[0].at("ts").get<double>(), 2.5);
  EXPECT_EQ(instants[0].at("args").at("bytes"), 400);
  EXPECT_FALSE(instants[0].contains("dur"));
}

TEST(TimelineTest, WritesMemoryCountersWithBudget) {
  std::vector<json> counters = with_phase(write(small_timeline()), "C");
  ASSERT_EQ(counters.size(), 4u);
  const double ts[] = {2.0, 2.5, 2.5, 4.5};
  const int allocated[] = {400, 800, 400, 800};
  const int reserved[] = {512, 1024, 1024, 1024};
  for (std::size_t i = 0; i < counters.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(counters[i].at("name"), "memory");
    EXPECT_DOUBLE_EQ(counters[i].at("ts").get<double>(), ts[i]);
    EXPECT_EQ(counters[i].at("args").at("allocated"), allocated[i]);
    EXPECT_EQ(counters[i].at("args").at("reserved"), reserved[i]);
    EXPECT_EQ(counters[i].at("args").at("budget"), 1000);
  }
}

TEST(TimelineTest, OmitsBudgetWhenUnset) {
  Timeline t = small_timeline();
  t.budget = SIZE_MAX;
  json trace = write(t);
  std::vector<json> counters = with_phase(trace, "C");
  ASSERT_EQ(counters.size(), 4u);
  for (const json& c : counters) {
    EXPECT_TRUE(c.at("args").contains("allocated"));
    EXPECT_FALSE(c.at("args").contains("budget")) << c;
  }
  EXPECT_FALSE(trace.at("otherData").contains("budget"));
}

TEST(TimelineTest, EmptyTimelineHasOnlyMetadata) {
  json trace = write(Timeline{});
  EXPECT_EQ(trace.at("traceEvents").size(), 3u);
}

TEST(TimelineTest, RejectsDecreasingMemoryTimes) {
  Timeline t = small_timeline();
  t.memory[2].time = 1000;
  std::ostringstream out;
  absl::Status status = write_timeline_file(t, "bad", out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("sample 2"), std::string_view::npos) << status;
  EXPECT_TRUE(out.str().empty());
}

TEST(TimelineTest, RejectsBadEventTimes) {
  for (double bad :
       {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(bad);
    Timeline start = small_timeline();
    start.events[1].start = bad;
    std::ostringstream out;
    absl::Status status = write_timeline_file(start, "bad", out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("event 1"), std::string_view::npos) << status;

    Timeline duration = small_timeline();
    duration.events[3].duration = bad;
    status = write_timeline_file(duration, "bad", out);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("event 3"), std::string_view::npos) << status;
  }
}

TEST(TimelineTest, ReportsStreamFailure) {
  std::ostringstream out;
  out.setstate(std::ios::badbit);
  EXPECT_FALSE(write_timeline_file(small_timeline(), "x", out).ok());
}

}  // namespace
}  // namespace remat
