#include "remat/timeline_file.h"

#include <absl/strings/str_cat.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace remat {
namespace {

using json = nlohmann::json;

constexpr int kPid = 1;
constexpr int kOpsTid = 1;
constexpr int kRecomputeTid = 2;

// The runtime clock counts nanoseconds, but the trace event format's "ts" and "dur" are
// microseconds (displayTimeUnit only changes how the viewer prints them).
double micros(double clock) { return clock / 1000.0; }

json thread_name(int tid, std::string_view name) {
  return {{"ph", "M"},
          {"pid", kPid},
          {"tid", tid},
          {"name", "thread_name"},
          {"args", {{"name", name}}}};
}

absl::Status validate(const Timeline& timeline) {
  for (std::size_t i = 0; i < timeline.events.size(); ++i) {
    const TimelineEvent& e = timeline.events[i];
    if (!std::isfinite(e.start) || e.start < 0 || !std::isfinite(e.duration) || e.duration < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("timeline event ", i, " ('", e.name, "') has start ", e.start,
                       " and duration ", e.duration, "; both must be finite and non-negative"));
    }
  }
  for (std::size_t i = 0; i < timeline.memory.size(); ++i) {
    const double t = timeline.memory[i].time;
    if (!std::isfinite(t)) {
      return absl::InvalidArgumentError(
          absl::StrCat("timeline memory sample ", i, " has a non-finite time ", t));
    }
    if (i > 0 && t < timeline.memory[i - 1].time) {
      return absl::InvalidArgumentError(absl::StrCat("timeline memory sample ", i,
                                                     " goes back in time: ", t, " after ",
                                                     timeline.memory[i - 1].time));
    }
  }
  return absl::OkStatus();
}

// One trace event for a timeline event: a slice on the ops or the recomputations track, or
// an instant for an eviction.
json event_of(const TimelineEvent& e) {
  if (e.kind == TimelineEvent::Kind::kEvict) {
    return {{"ph", "i"},
            {"s", "t"},
            {"pid", kPid},
            {"tid", kOpsTid},
            {"name", absl::StrCat("evict ", e.name)},
            {"cat", "evict"},
            {"ts", micros(e.start)},
            {"args", {{"bytes", e.bytes}}}};
  }
  const bool first_run = e.kind == TimelineEvent::Kind::kCompute;
  return {{"ph", "X"},
          {"pid", kPid},
          {"tid", first_run ? kOpsTid : kRecomputeTid},
          {"name", e.name},
          {"cat", first_run ? "compute" : "recompute"},
          {"ts", micros(e.start)},
          {"dur", micros(e.duration)},
          {"args", {{"bytes", e.bytes}}}};
}

}  // namespace

absl::Status write_timeline_file(const Timeline& timeline, std::string_view title,
                                 std::ostream& out) {
  if (absl::Status status = validate(timeline); !status.ok()) return status;

  json events = json::array();
  events.push_back({{"ph", "M"},
                    {"pid", kPid},
                    {"tid", 0},
                    {"name", "process_name"},
                    {"args", {{"name", title}}}});
  events.push_back(thread_name(kOpsTid, "ops"));
  events.push_back(thread_name(kRecomputeTid, "recomputations"));
  for (const TimelineEvent& e : timeline.events) events.push_back(event_of(e));

  const bool has_budget = timeline.budget != SIZE_MAX;
  for (const MemorySample& m : timeline.memory) {
    json args = {{"allocated", m.allocated}, {"reserved", m.reserved}};
    if (has_budget) args["budget"] = timeline.budget;
    events.push_back({{"ph", "C"},
                      {"pid", kPid},
                      {"name", "memory"},
                      {"ts", micros(m.time)},
                      {"args", std::move(args)}});
  }

  json other = {{"title", title},
                {"clock_unit", "ns"},
                {"events", timeline.events.size()},
                {"memory_samples", timeline.memory.size()}};
  if (has_budget) other["budget"] = timeline.budget;

  const json trace = {{"traceEvents", std::move(events)},
                      {"displayTimeUnit", "ns"},
                      {"otherData", std::move(other)}};
  // Op names and titles are not guaranteed to be UTF-8; replace bad bytes instead of throwing.
  out << trace.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  out.flush();
  if (!out) return absl::DataLossError("failed to write the timeline file to the output stream");
  return absl::OkStatus();
}

}  // namespace remat
