// remat_torch._C: the Python face of remat/torch.h (pytorch/python/remat_torch wraps it).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor from Python (side_read)

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "remat/graph.h"
#include "remat/planner.h"
#include "remat/torch.h"

namespace py = pybind11;

namespace {

py::dict stats_dict() {
  const remat::RuntimeStats s = remat::torch_backend::stats();
  py::dict d;
  d["peak_reserved_bytes"] = s.memory.peak_reserved;
  d["reserved_bytes"] = s.memory.reserved;
  d["peak_allocated_bytes"] = s.memory.peak_allocated;
  d["allocated_bytes"] = s.memory.allocated;
  d["evictions"] = s.evictions;
  d["recomputations"] = s.recomputations;
  d["calls"] = s.calls;
  d["compute_overhead"] = s.compute_overhead();
  d["base_cost"] = s.base_cost;
  d["recompute_cost"] = s.recompute_cost;
  d["pinned_bytes"] = s.pinned_bytes;
  d["updates"] = s.updates;
  d["ooms"] = s.ooms;
  d["retried_requests"] = s.retried_requests;
  d["live_tensors"] = s.live_tensors;
  d["hint_evictions"] = s.hint_evictions;
  d["hint_mismatches"] = s.hint_mismatches;
  d["deferred_ops"] = s.deferred_ops;
  d["placed_allocations"] = s.memory.placed_allocations;
  d["placement_misses"] = s.memory.placement_misses;
  d["offloads"] = s.offloads;
  d["restores"] = s.restores;
  d["offloaded_bytes"] = s.offloaded_bytes;
  d["peak_offloaded_bytes"] = s.peak_offloaded_bytes;
  d["transfer_cost"] = s.transfer_cost;
  d["budget"] = remat::torch_backend::budget();
  return d;
}

py::list held_list() {
  py::list out;
  for (const remat::HeldTensors& h : remat::torch_backend::held_tensors()) {
    py::dict d;
    d["op"] = h.op;
    d["tensors"] = h.tensors;
    d["bytes"] = h.bytes;
    d["resident_bytes"] = h.resident_bytes;
    d["pinned_bytes"] = h.pinned_bytes;
    out.append(d);
  }
  return out;
}

py::dict plan_dict() {
  const remat::torch_backend::PlanReport r = remat::torch_backend::plan_report();
  py::dict d;
  d["phase"] = r.phase;
  d["source"] = r.source;
  d["steps"] = r.steps;
  d["dtr_step_overhead"] = r.dtr_step_overhead;
  d["plan_step_overhead"] = r.plan_step_overhead;
  d["dtr_step_seconds"] = r.dtr_step_seconds;
  d["plan_step_seconds"] = r.plan_step_seconds;
  d["planning_seconds"] = r.planning_seconds;
  d["unread_bytes"] = r.unread_bytes;
  d["scratch_bytes"] = r.scratch_bytes;
  py::list screened;
  for (const remat::torch_backend::ScreenedCandidate& c : r.screened) {
    py::dict row;
    row["source"] = c.source;
    row["simulated_overhead"] = c.simulated_overhead;
    row["placed_allocations"] = c.placed_allocations;
    row["placement_misses"] = c.placement_misses;
    row["failure"] = c.failure;
    screened.append(row);
  }
  d["screened"] = screened;
  return d;
}

// One of remat's planners on a remat-graph-v1 text (the partitioner of torch.compile:
// remat_torch/partitioner.py). A budget of None: the planner's own default.
py::dict plan_graph(const std::string& graph_json, const std::string& planner,
                    std::optional<std::int64_t> budget, double time_limit) {
  absl::StatusOr<remat::Graph> graph = remat::parse_graph(graph_json);
  if (!graph.ok()) throw std::invalid_argument(std::string(graph.status().message()));
  remat::PlanOptions options;
  options.budget_bytes = budget;
  options.time_limit_seconds = time_limit;
  absl::StatusOr<remat::Plan> plan;
  {
    py::gil_scoped_release unlocked;  // planners may run for seconds
    plan = remat::run_planner(planner, *graph, options);
  }
  if (!plan.ok()) throw std::invalid_argument(std::string(plan.status().message()));
  py::dict d;
  d["feasible"] = plan->feasible;
  d["reason"] = plan->reason;
  d["order"] = plan->schedule.order;
  d["peak_bytes"] = plan->sim.peak_bytes;
  d["overhead"] = plan->sim.overhead;
  d["solve_seconds"] = plan->solve_seconds;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "remat's runtime behind PyTorch's PrivateUse1 device";
  m.def("set_budget", &remat::torch_backend::set_budget, py::arg("bytes"));
  m.def("budget", &remat::torch_backend::budget);
  m.def("set_policy", &remat::torch_backend::set_policy, py::arg("name"));
  m.def("set_host_memory", &remat::torch_backend::set_host_memory, py::arg("bytes"));
  m.def("set_costs", &remat::torch_backend::set_costs, py::arg("costs"));
  m.def("costs", &remat::torch_backend::costs);
  m.def("set_execution", &remat::torch_backend::set_execution, py::arg("name"));
  m.def("execution", &remat::torch_backend::execution);
  m.def("executions", &remat::torch_backend::executions);
  m.def("execution_problems", &remat::torch_backend::execution_problems);
  m.def("clear_execution_problems", &remat::torch_backend::clear_execution_problems);
  m.def("host_waits", &remat::torch_backend::host_waits);
  m.def("_side_read", &remat::torch_backend::side_read, py::arg("tensor"),
        py::arg("record_stream"));
  m.def("policy", &remat::torch_backend::policy);
  m.def("policies", &remat::eviction_policy_names);
  m.def("stats", &stats_dict);
  m.def("held_tensors", &held_list);
  m.def("plan_report", &plan_dict);
  m.def("reset_peaks", &remat::torch_backend::reset_peaks);
  m.def("evict_all", &remat::torch_backend::evict_all);
  m.def("plan_graph", &plan_graph, py::arg("graph_json"), py::arg("planner"), py::arg("budget"),
        py::arg("time_limit"));
  m.def("planners", &remat::planner_names);
  py::class_<remat::torch_backend::CpuMemoryMeter>(m, "_CpuMemoryMeter")
      .def(py::init<>())
      .def("live_bytes", &remat::torch_backend::CpuMemoryMeter::live_bytes)
      .def("peak_bytes", &remat::torch_backend::CpuMemoryMeter::peak_bytes);
  py::class_<remat::torch_backend::StepScope>(m, "_StepScope")
      .def(py::init<>())
      .def("end", &remat::torch_backend::StepScope::end);
}
