// The library's reports as the tools print them with --json: the step driver's per-shape
// reports and the runtime's statistics. JSON stays out of the public headers; this is the
// one place that writes these objects.
//
//   nlohmann::json j;
//   remat::report::add_runtime_stats(j, driver.runtime().stats());
//   j["shape_plans"] = remat::report::shape_reports_json(driver.shapes());
#ifndef REMAT_TOOLS_REPORT_REPORT_JSON_H_
#define REMAT_TOOLS_REPORT_REPORT_JSON_H_

#include <nlohmann/json.hpp>
#include <vector>

#include "remat/runtime.h"
#include "remat/step_driver.h"

namespace remat::report {

// One object per shape: shape, steps, decision, why, plan, plan_seconds, arena_bytes,
// placed_peak_live_bytes, dtr_step_overhead, plan_step_overhead, reused_steps, screened
// (each present where the report has it).
nlohmann::json shape_reports_json(const std::vector<ShapeReport>& shapes);

// compute_overhead, evictions, recomputations, search_seconds, the memory resource's
// counters (deferred frees, segment reserves and releases, placed allocations and misses),
// compactions, the hint counters, and on the CUDA backend what start-up measured.
void add_runtime_stats(nlohmann::json& j, const RuntimeStats& s, bool cuda);

}  // namespace remat::report

#endif  // REMAT_TOOLS_REPORT_REPORT_JSON_H_
