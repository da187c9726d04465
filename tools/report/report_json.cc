#include "tools/report/report_json.h"

#include <string>

namespace remat::report {
namespace {

nlohmann::json screened_json(const ScreenedPlan& c) {
  nlohmann::json j;
  if (c.fraction) j["fraction"] = *c.fraction;
  j["plan"] = c.plan;
  if (c.simulated_overhead)
    j["simulated_overhead"] = *c.simulated_overhead;
  else if (!c.failure.empty())
    j["simulated_overhead"] = c.failure;
  if (c.arena_bytes) j["arena_bytes"] = *c.arena_bytes;
  return j;
}

nlohmann::json shape_json(const ShapeReport& s) {
  nlohmann::json j;
  j["shape"] = s.shape;
  j["steps"] = s.steps;
  j["decision"] = std::string(shape_decision_name(s.decision));
  if (!s.why.empty()) j["why"] = s.why;
  if (s.planned) {
    j["plan"] = s.plan;
    j["plan_seconds"] = s.plan_seconds;
    if (s.arena_bytes) j["arena_bytes"] = *s.arena_bytes;
    if (s.placed_peak_live_bytes) j["placed_peak_live_bytes"] = *s.placed_peak_live_bytes;
    if (s.dtr_step_overhead) j["dtr_step_overhead"] = *s.dtr_step_overhead;
    if (s.plan_step_overhead) j["plan_step_overhead"] = *s.plan_step_overhead;
    j["reused_steps"] = s.reused_steps;
  }
  if (!s.screened.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const ScreenedPlan& c : s.screened) list.push_back(screened_json(c));
    j["screened"] = std::move(list);
  }
  return j;
}

}  // namespace

nlohmann::json shape_reports_json(const std::vector<ShapeReport>& shapes) {
  nlohmann::json list = nlohmann::json::array();
  for (const ShapeReport& s : shapes) list.push_back(shape_json(s));
  return list;
}

void add_runtime_stats(nlohmann::json& j, const RuntimeStats& s, bool cuda) {
  j["compute_overhead"] = s.compute_overhead();
  j["evictions"] = s.evictions;
  j["recomputations"] = s.recomputations;
  j["retried_requests"] = s.retried_requests;
  j["search_seconds"] = s.search_seconds;
  j["deferred_frees"] = s.memory.deferred_frees;
  j["compactions"] = s.compactions;
  j["compaction_bytes"] = s.compaction_bytes;
  j["evacuations"] = s.evacuations;
  j["evacuation_bytes"] = s.evacuation_bytes;
  j["packed_storages"] = s.packed_storages;
  j["placed_allocations"] = s.memory.placed_allocations;
  j["placement_misses"] = s.memory.placement_misses;
  j["segment_reserves"] = s.memory.segment_reserves;
  j["segment_releases"] = s.memory.segment_releases;
  j["hint_evictions"] = s.hint_evictions;
  j["hint_mismatches"] = s.hint_mismatches;
  j["offloads"] = s.offloads;
  j["restores"] = s.restores;
  j["peak_offloaded_bytes"] = s.peak_offloaded_bytes;
  j["transfer_cost"] = s.transfer_cost;
  j["transfer_exposed"] = s.transfer_exposed;
  if (cuda) {
    j["cuda_device_total_bytes"] = s.cuda.device_total_bytes;
    j["cuda_outside_budget_bytes"] = s.cuda.outside_bytes;
    j["cuda_workspace_bytes"] = s.cuda.workspace_bytes;
  }
}

}  // namespace remat::report
