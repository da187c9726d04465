// Offloads in a schedule: checks, memory and timing (runtime/ir/offloads.h).
//
// Note [Offloads in a schedule]
// An offload {step, free, fetch} sends the instance made at `step` to host memory and
// brings it back: it is resident on [step, free), on the host until `fetch`, and resident
// again from `fetch` through its last read; no step in [free, fetch) reads it. The copy out
// starts when `step` ends (the instance never changes, so it may be read while it is
// copied), on the device-to-host engine after the copies queued before it; the copy back
// starts when the compute stream reaches `fetch`, on the host-to-device engine. Each
// engine runs its copies one at a time, each priced by HostLink::price, beside the kernels
// and beside the other engine. The compute stream waits at `free` until the copy out has
// ended (the memory is reused from there) and, at a step that reads a fetched instance,
// until the copy back has ended. Those waits are the exposed transfer time, added to the
// schedule's cost: a copy that starts early enough costs nothing. Host memory holds the
// instance from when its copy out starts through `fetch`.
#include "runtime/ir/offloads.h"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstddef>

namespace remat {
namespace {

using std::size_t;

// Per step: the offload whose instance that step made, or -1.
std::vector<int> offload_of_step(const Schedule& s) {
  std::vector<int> of(s.order.size(), -1);
  for (size_t k = 0; k < s.offloads.size(); ++k) {
    const int step = s.offloads[k].step;
    if (step >= 0 && static_cast<size_t>(step) < s.order.size() && of[step] < 0)
      of[static_cast<size_t>(step)] = static_cast<int>(k);
  }
  return of;
}

// Per offload: the steps that read its instance, in order.
std::vector<std::vector<int>> reads_of_offloaded(const Graph& g, const Schedule& s,
                                                 const std::vector<int>& of) {
  std::vector<std::vector<int>> reads(s.offloads.size());
  std::vector<int> latest(static_cast<size_t>(g.size()), -1);
  for (size_t j = 0; j < s.order.size(); ++j) {
    for (int u : g.nodes[static_cast<size_t>(s.order[j])].inputs) {
      const int inst = latest[static_cast<size_t>(u)];
      if (inst >= 0 && of[static_cast<size_t>(inst)] >= 0)
        reads[static_cast<size_t>(of[static_cast<size_t>(inst)])].push_back(static_cast<int>(j));
    }
    latest[static_cast<size_t>(s.order[j])] = static_cast<int>(j);
  }
  for (std::vector<int>& r : reads) r.erase(std::unique(r.begin(), r.end()), r.end());
  return reads;
}

std::string check_one(const Graph& g, const Schedule& s, size_t k, const std::vector<int>& of,
                      const std::vector<int>& reads) {
  const Offload& o = s.offloads[k];
  const int steps = static_cast<int>(s.order.size());
  const std::string where =
      absl::StrCat("offload ", k, " (step ", o.step, ", free ", o.free, ", fetch ", o.fetch, "): ");
  if (o.step < 0 || o.step >= steps) return absl::StrCat(where, "step is not in the order");
  if (of[static_cast<size_t>(o.step)] != static_cast<int>(k))
    return absl::StrCat(where, "another offload names the same instance");
  if (!(o.step < o.free && o.free < o.fetch && o.fetch < steps))
    return absl::StrCat(where, "needs step < free < fetch < ", steps, " (the order's length)");
  const auto in_gap =
      std::find_if(reads.begin(), reads.end(), [&](int r) { return r >= o.free && r < o.fetch; });
  if (in_gap != reads.end()) {
    return absl::StrCat(where, "step ", *in_gap, " (", node_label(g, s.order[*in_gap]), ") reads ",
                        node_label(g, s.order[o.step]), " while it is on the host");
  }
  if (reads.empty() || reads.back() < o.fetch)
    return absl::StrCat(where, "no step reads it after the fetch");
  return "";
}

}  // namespace

std::string check_offloads(const Graph& g, const Schedule& s, const Instances& in) {
  if (s.offloads.empty() || !in.error.empty()) return in.error;
  const std::vector<int> of = offload_of_step(s);
  const std::vector<std::vector<int>> reads = reads_of_offloaded(g, s, of);
  for (size_t k = 0; k < s.offloads.size(); ++k) {
    std::string err = check_one(g, s, k, of, reads[k]);
    if (!err.empty()) return err;
  }
  return "";
}

std::vector<int64_t> apply_offloads(const Graph& g, const Schedule& s,
                                    std::vector<int64_t>* resident) {
  const size_t steps = s.order.size();
  std::vector<int64_t> device_delta(steps + 1, 0), host_delta(steps + 1, 0);
  for (const Offload& o : s.offloads) {
    const int64_t b = g.nodes[static_cast<size_t>(s.order[static_cast<size_t>(o.step)])].bytes;
    device_delta[static_cast<size_t>(o.free)] -= b;
    device_delta[static_cast<size_t>(o.fetch)] += b;
    host_delta[static_cast<size_t>(o.step) + 1] += b;
    host_delta[static_cast<size_t>(o.fetch) + 1] -= b;
  }
  std::vector<int64_t> host(steps, 0);
  int64_t device_change = 0, on_host = 0;
  for (size_t j = 0; j < steps; ++j) {
    device_change += device_delta[j];
    on_host += host_delta[j];
    (*resident)[j] += device_change;
    host[j] = on_host;
  }
  return host;
}

ScheduleTiming time_schedule(const Graph& g, const Schedule& s, const HostLink& link) {
  const size_t steps = s.order.size();
  const std::vector<int> of = offload_of_step(s);
  std::vector<std::vector<int>> fetched_at(steps), freed_at(steps);
  for (size_t k = 0; k < s.offloads.size(); ++k) {
    fetched_at[static_cast<size_t>(s.offloads[k].fetch)].push_back(static_cast<int>(k));
    freed_at[static_cast<size_t>(s.offloads[k].free)].push_back(static_cast<int>(k));
  }
  ScheduleTiming t;
  t.start.assign(steps, 0.0);
  t.out_done.assign(s.offloads.size(), 0.0);
  t.in_done.assign(s.offloads.size(), -1.0);
  const std::vector<double> cost = step_costs(g, s.order);
  std::vector<int> latest(static_cast<size_t>(g.size()), -1);
  double now = 0, out_engine = 0, in_engine = 0;
  auto wait_for = [&](double done) {
    if (done > now) t.exposed += done - now, now = done;
  };
  for (size_t j = 0; j < steps; ++j) {
    for (int k : freed_at[j]) wait_for(t.out_done[static_cast<size_t>(k)]);
    for (int k : fetched_at[j]) {
      const double price = link.price(static_cast<size_t>(
          g.nodes[static_cast<size_t>(s.order[static_cast<size_t>(s.offloads[k].step)])].bytes));
      in_engine = std::max(in_engine, now) + price;
      t.in_done[static_cast<size_t>(k)] = in_engine;
      t.transfer += price;
    }
    const Node& node = g.nodes[static_cast<size_t>(s.order[j])];
    for (int u : node.inputs) {
      const int inst = latest[static_cast<size_t>(u)];
      const int k = inst >= 0 ? of[static_cast<size_t>(inst)] : -1;
      if (k >= 0 && s.offloads[static_cast<size_t>(k)].fetch <= static_cast<int>(j))
        wait_for(t.in_done[static_cast<size_t>(k)]);
    }
    t.start[j] = now;
    now += cost[j];
    latest[static_cast<size_t>(s.order[j])] = static_cast<int>(j);
    if (const int k = of[j]; k >= 0) {
      const double price = link.price(static_cast<size_t>(node.bytes));
      out_engine = std::max(out_engine, now) + price;
      t.out_done[static_cast<size_t>(k)] = out_engine;
      t.transfer += price;
    }
  }
  t.end = now;
  return t;
}

}  // namespace remat
